//! The shapes the packed weights and the microkernels agree on: panels of [`NR`] outputs stored as groups
//! of [`GROUP_BYTES`] (a bf16 pair, an f32, [`G`] int8 weights), written by [`interleave`]; the rows a
//! microkernel call takes ([`MR`], [`MR8`]) and the block of C it writes ([`Tile`]). Below every kernel:
//! the packing, the GEMM drivers and each instruction set's microkernels read it, and it reads none of them.

/// Output rows per panel (4 vectors of 16 f32 lanes).
pub const NR: usize = 64;

/// Rows per microkernel call, fp32 and bf16 arms.
pub const MR: usize = 6;

/// Rows per microkernel call, int8 arm.
pub(crate) const MR8: usize = 6;

/// Inputs per group (one i32 lane of `vpdpbusd`).
pub const G: usize = 4;
// A group of G int8 weights is one of the panel groups every packed form shares.
const _: () = assert!(G == GROUP_BYTES);

/// The block of C one microkernel call writes: `rows` rows of stride `ldc` from `c`, the first
/// `ncols ≤ NR` columns of each; `load` adds to what is there (every input block after the first).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tile {
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub ncols: usize,
    pub load: bool,
}

/// Bytes in a group of a panel. The bf16 storage (`[k/2][NR][2]` u16), the f32 storage (`[k][NR]`) and
/// the int8 form (`[k/4][NR][4]` i8) all lay a panel out as `[groups][NR][4 bytes]`: a bf16 pair, one
/// f32, four int8 weights.
pub(crate) const GROUP_BYTES: usize = 4;

// The panels are filled from little-endian bytes as they lie in memory (a bf16 row's bytes are its pairs).
const _: () = assert!(cfg!(target_endian = "little"));

/// Write rows into a panel laid out `[groups][NR][GROUP_BYTES]`: `(j, bytes)` puts a row's bytes, a group
/// at a time, in slot `j` of each group; a short row (a last, partial group) leaves the rest as it was.
/// Eight rows at a time go through the panel 16 groups at a time: the 4 KiB being written stay in L1,
/// and the rows are read as eight sequential streams. (Row by row, each row sweeps the whole panel, 160 KB
/// for 2,560 int8 inputs; all 64 rows at once are more streams than the prefetchers follow: a bf16 load
/// from the page cache took 1.4× as long.)
pub(crate) fn interleave(panel: &mut [u8], rows: &[(usize, &[u8])]) {
    const BLOCK: usize = 16;
    const ROWS: usize = 8;
    let line = NR * GROUP_BYTES;
    assert_eq!(panel.len() % line, 0, "a panel is whole groups");
    for &(j, row) in rows {
        assert!(
            j < NR && row.len() <= panel.len() / NR,
            "a row outside its panel"
        );
    }
    for run in rows.chunks(ROWS) {
        interleave_run(panel, run, BLOCK);
    }
}

fn interleave_run(panel: &mut [u8], rows: &[(usize, &[u8])], block: usize) {
    let line = NR * GROUP_BYTES;
    for (b, dst) in panel.chunks_mut(block * line).enumerate() {
        let from = b * block * GROUP_BYTES;
        for &(j, row) in rows {
            if from >= row.len() {
                continue;
            }
            let src = &row[from..row.len().min(from + block * GROUP_BYTES)];
            let at = j * GROUP_BYTES;
            let mut groups = src.chunks_exact(GROUP_BYTES);
            for (d, s) in dst.chunks_exact_mut(line).zip(groups.by_ref()) {
                let d: &mut [u8; GROUP_BYTES] = (&mut d[at..at + GROUP_BYTES])
                    .try_into()
                    .expect("a whole group");
                *d = s.try_into().expect("a whole group");
            }
            let tail = groups.remainder();
            if !tail.is_empty() {
                let g = src.len() / GROUP_BYTES;
                dst[g * line + at..g * line + at + tail.len()].copy_from_slice(tail);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row's bytes land in its slot of each group, blocks and a short last group included, and the
    /// slots no row names keep what they held.
    #[test]
    fn interleave_puts_each_group_in_its_slot() {
        let groups = 35;
        let mut panel = vec![0xAAu8; groups * NR * GROUP_BYTES];
        let rows: Vec<Vec<u8>> = (0..NR - 1)
            .map(|j| {
                (0..groups * GROUP_BYTES - j % 4)
                    .map(|i| (i * 7 + j * 13) as u8)
                    .collect()
            })
            .collect();
        let named: Vec<(usize, &[u8])> =
            rows.iter().enumerate().map(|(j, r)| (j, &r[..])).collect();
        interleave(&mut panel, &named);
        for g in 0..groups {
            for j in 0..NR {
                for b in 0..GROUP_BYTES {
                    let got = panel[(g * NR + j) * GROUP_BYTES + b];
                    let i = g * GROUP_BYTES + b;
                    let want = rows.get(j).and_then(|r| r.get(i)).copied().unwrap_or(0xAA);
                    assert_eq!(got, want, "group {g} row {j} byte {b}");
                }
            }
        }
    }
}
