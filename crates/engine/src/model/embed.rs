//! The token embedding table.

/// The token embedding table, kept in its stored dtype.
pub(crate) enum Embedding {
    Bf16(Vec<u16>),
    /// BF16 rows read from the checkpoint's mapping as tokens need them: the 4B's 1.2 GiB table is not
    /// copied, and only the rows of the tokens seen become resident.
    MappedBf16(kev_release::shards::MappedTensor),
    F32(Vec<f32>),
}

impl std::fmt::Debug for Embedding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Embedding::Bf16(v) => write!(f, "Embedding::Bf16({} values)", v.len()),
            Embedding::MappedBf16(t) => write!(f, "Embedding::MappedBf16({t:?})"),
            Embedding::F32(v) => write!(f, "Embedding::F32({} values)", v.len()),
        }
    }
}

impl Embedding {
    pub fn row(&self, id: usize, width: usize, out: &mut [f32]) {
        match self {
            Embedding::Bf16(v) => {
                for (o, b) in out.iter_mut().zip(&v[id * width..(id + 1) * width]) {
                    *o = crate::kernels::bf16_to_f32(*b);
                }
            }
            Embedding::MappedBf16(t) => {
                let row = &t.bytes()[2 * id * width..2 * (id + 1) * width];
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = crate::kernels::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Embedding::F32(v) => out.copy_from_slice(&v[id * width..(id + 1) * width]),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Embedding::Bf16(v) => v.len() * 2,
            Embedding::MappedBf16(t) => t.bytes().len(),
            Embedding::F32(v) => v.len() * 4,
        }
    }
}
