//! Python's `random.Random(seed).shuffle`, reproduced exactly, so `/v1/systemone/permute` tries the option
//! orders the author's server tries for the same seed.
//!
//! CPython seeds its Mersenne Twister (MT19937) from an integer with `init_by_array` over the 32-bit words of
//! `abs(seed)` (least significant first; `[0]` for zero), draws `getrandbits(k)` as the top `k` bits of one
//! 32-bit output (`k ≤ 32`), and shuffles with Fisher–Yates from the end, `j = _randbelow(i + 1)` by rejection:
//! `k = n.bit_length()`, redraw while `r ≥ n`. Checked against CPython 3.11 in the tests.

const N: usize = 624;
const M: usize = 397;

/// CPython's `random.Random` state for integer seeds.
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl PyRandom {
    /// `random.Random(seed)` for an integer seed given as the 32-bit words of `abs(seed)`, least significant
    /// first (no trailing zero words; empty for zero).
    pub fn from_words(words: &[u32]) -> Self {
        let key: &[u32] = if words.is_empty() { &[0] } else { words };
        let mut r = PyRandom {
            mt: [0; N],
            index: N,
        };
        r.init_genrand(19_650_218);
        let mt = &mut r.mt;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        r
    }

    /// `random.Random(seed)` for a machine-size integer.
    pub fn new(seed: i128) -> Self {
        let mut n = seed.unsigned_abs();
        let mut words = Vec::new();
        while n > 0 {
            words.push(n as u32);
            n >>= 32;
        }
        Self::from_words(&words)
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for k in 0..N {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for `1 ≤ k ≤ 32`.
    fn getrandbits(&mut self, k: u32) -> u32 {
        self.next_u32() >> (32 - k)
    }

    /// `_randbelow(n)` for `1 ≤ n ≤ 2^32`.
    fn randbelow(&mut self, n: u64) -> u64 {
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k) as u64;
            if r < n {
                return r;
            }
        }
    }

    /// `shuffle(x)` in place.
    pub fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            let j = self.randbelow(i as u64 + 1) as usize;
            x.swap(i, j);
        }
    }
}

/// The 32-bit words of `abs(n)` for an integer written in decimal (optional sign), least significant first;
/// `None` for anything else or beyond Python's 4,300-digit limit.
pub fn words_of_decimal(text: &str) -> Option<Vec<u32>> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || digits.len() > 4300 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut words: Vec<u32> = Vec::new();
    for d in digits.bytes() {
        let mut carry = (d - b'0') as u64;
        for w in words.iter_mut() {
            let v = *w as u64 * 10 + carry;
            *w = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            words.push(carry as u32);
        }
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `random.Random(seed)` then `shuffle(list(range(n)))`, as CPython prints them.
    fn shuffled(words: &[u32], n: usize, times: usize) -> Vec<Vec<usize>> {
        let mut r = PyRandom::from_words(words);
        (0..times)
            .map(|_| {
                let mut v: Vec<usize> = (0..n).collect();
                r.shuffle(&mut v);
                v
            })
            .collect()
    }

    #[test]
    fn decimal_words() {
        assert_eq!(words_of_decimal("0"), Some(vec![]));
        assert_eq!(words_of_decimal("-7"), Some(vec![7]));
        assert_eq!(words_of_decimal("4294967296"), Some(vec![0, 1]));
        assert_eq!(
            words_of_decimal("18446744073709551617"),
            Some(vec![1, 0, 1])
        );
        assert_eq!(words_of_decimal("1.5"), None);
        assert_eq!(words_of_decimal(""), None);
    }

    #[test]
    fn first_outputs_match_the_reference_generator() {
        // MT19937 seeded by init_by_array([0x123, 0x234, 0x345, 0x456]): the reference implementation's
        // published first outputs.
        let mut r = PyRandom::from_words(&[0x123, 0x234, 0x345, 0x456]);
        let first: Vec<u32> = (0..5).map(|_| r.next_u32()).collect();
        assert_eq!(
            first,
            vec![1067595299, 955945823, 477289528, 4107218783, 4228976476]
        );
    }

    /// Printed by CPython 3.11: `r = random.Random(seed)`, then `v = list(range(n)); r.shuffle(v)` for n = 6,
    /// 3, 10, 48 in turn on the same generator.
    #[test]
    fn shuffles_match_cpython() {
        let cases: Vec<(&str, Vec<Vec<usize>>)> = vec![
            (
                "0",
                vec![
                    vec![4, 2, 1, 0, 5, 3],
                    vec![0, 2, 1],
                    vec![6, 9, 0, 8, 2, 1, 4, 3, 5, 7],
                    vec![
                        29, 36, 5, 43, 31, 41, 37, 23, 18, 14, 44, 3, 32, 33, 11, 26, 7, 10, 15,
                        24, 47, 40, 12, 2, 0, 17, 25, 1, 8, 16, 46, 28, 39, 13, 20, 27, 22, 42, 35,
                        30, 21, 4, 6, 19, 9, 38, 45, 34,
                    ],
                ],
            ),
            (
                "1",
                vec![
                    vec![2, 3, 5, 0, 4, 1],
                    vec![0, 2, 1],
                    vec![2, 4, 1, 5, 8, 9, 0, 3, 6, 7],
                    vec![
                        19, 18, 23, 22, 12, 41, 2, 16, 42, 8, 46, 32, 4, 25, 10, 5, 3, 33, 43, 36,
                        9, 29, 30, 21, 26, 11, 7, 45, 15, 31, 35, 47, 38, 27, 13, 24, 0, 34, 39,
                        40, 1, 20, 6, 37, 14, 17, 28, 44,
                    ],
                ],
            ),
            (
                "42",
                vec![
                    vec![3, 1, 2, 4, 0, 5],
                    vec![1, 2, 0],
                    vec![7, 9, 5, 6, 0, 3, 4, 8, 1, 2],
                    vec![
                        15, 13, 29, 25, 7, 46, 43, 31, 16, 5, 9, 33, 30, 20, 18, 37, 23, 45, 44, 8,
                        19, 22, 11, 39, 42, 2, 3, 40, 24, 6, 4, 36, 21, 27, 10, 0, 17, 28, 47, 26,
                        34, 41, 12, 35, 1, 38, 32, 14,
                    ],
                ],
            ),
            (
                "-5",
                vec![
                    vec![1, 0, 3, 5, 2, 4],
                    vec![2, 0, 1],
                    vec![4, 9, 6, 5, 7, 3, 8, 1, 2, 0],
                    vec![
                        3, 34, 16, 14, 7, 46, 30, 31, 1, 38, 41, 2, 22, 18, 32, 25, 12, 19, 43, 23,
                        20, 21, 42, 29, 39, 9, 47, 27, 5, 6, 40, 44, 33, 45, 35, 37, 28, 8, 4, 10,
                        24, 11, 17, 26, 13, 0, 15, 36,
                    ],
                ],
            ),
            (
                "4294967296",
                vec![
                    vec![1, 4, 5, 3, 2, 0],
                    vec![0, 1, 2],
                    vec![5, 4, 6, 2, 3, 9, 1, 0, 7, 8],
                    vec![
                        20, 24, 6, 28, 31, 27, 18, 21, 45, 16, 4, 3, 26, 15, 47, 38, 13, 14, 25, 2,
                        5, 43, 40, 46, 37, 33, 1, 23, 12, 0, 41, 39, 11, 34, 36, 9, 32, 22, 17, 35,
                        8, 19, 42, 7, 44, 10, 29, 30,
                    ],
                ],
            ),
            (
                "1180591620717411315769",
                vec![
                    vec![2, 1, 4, 5, 0, 3],
                    vec![0, 2, 1],
                    vec![6, 1, 8, 4, 3, 2, 7, 0, 9, 5],
                    vec![
                        12, 5, 34, 24, 17, 28, 31, 26, 23, 44, 47, 3, 40, 7, 9, 35, 33, 42, 19, 4,
                        36, 30, 22, 1, 11, 46, 18, 32, 25, 45, 15, 0, 2, 8, 29, 21, 41, 14, 10, 27,
                        20, 38, 16, 39, 37, 13, 43, 6,
                    ],
                ],
            ),
            (
                "123456789012345678901234567890",
                vec![
                    vec![2, 3, 0, 4, 1, 5],
                    vec![1, 0, 2],
                    vec![7, 2, 9, 6, 1, 0, 8, 4, 5, 3],
                    vec![
                        12, 3, 45, 41, 42, 38, 17, 28, 13, 26, 10, 16, 4, 2, 14, 27, 35, 18, 39,
                        40, 46, 33, 23, 25, 0, 5, 31, 44, 36, 20, 43, 34, 21, 1, 24, 29, 22, 9, 11,
                        8, 7, 15, 47, 6, 19, 37, 30, 32,
                    ],
                ],
            ),
        ];
        for (seed, want) in cases {
            let mut r = PyRandom::from_words(&words_of_decimal(seed).unwrap());
            for w in want {
                let mut v: Vec<usize> = (0..w.len()).collect();
                r.shuffle(&mut v);
                assert_eq!(v, w, "seed {seed}");
            }
        }
        assert_eq!(
            shuffled(&[], 6, 1),
            shuffled(&words_of_decimal("0").unwrap(), 6, 1)
        );
        let mut a = PyRandom::new(-5);
        let mut v: Vec<usize> = (0..6).collect();
        a.shuffle(&mut v);
        assert_eq!(v, vec![1, 0, 3, 5, 2, 4]);
    }
}
