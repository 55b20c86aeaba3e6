"""Monte Carlo: which share of the int8 GEMM's blocks could run the AVX2 vpmaddubsw pair-sum chain exactly.

usage: python pairsum_bound.py   (numpy)
"""
# Which share of the int8 GEMM's blocks could run the vpmaddubsw pair-sum chain exactly (four u8 x s8
# products summed in i16), on data shaped like the synthetic 4B's: per-row absmax int8 of Gaussian rows.
import numpy as np
rng = np.random.default_rng(0)
K = 2560
def q(x):  # per-row symmetric absmax to [-127, 127]
    s = np.abs(x).max(axis=1, keepdims=True) / 127
    return np.clip(np.rint(x / s), -127, 127).astype(np.int64)
W = q(rng.standard_normal((64, K)))          # one panel of 64 outputs
res = {}
for name, heavy in (("gaussian activations", False), ("heavy-tailed activations (t, 3 dof)", True)):
    X = rng.standard_t(3, (6 * 64, K)) if heavy else rng.standard_normal((6 * 64, K))
    A = q(X)
    # Sets S of four inputs summed in i16: inputs (8g+0, 8g+1, 8g+4, 8g+5) and (8g+2, 8g+3, 8g+6, 8g+7).
    idx = np.arange(K).reshape(-1, 8)
    sets = np.concatenate([idx[:, [0, 1, 4, 5]], idx[:, [2, 3, 6, 7]]])
    # form (b): u8 = w + 128 (weights), s8 = a: every set is exact if 255 * sum|a| <= 32767 (activation rows)
    b_ok = (255 * np.abs(A[:, sets]).sum(axis=2) <= 32767)
    # form (c): u8 = a + 128 (activations), s8 = w: exact if 255 * sum|w| <= 32767 (weight columns)
    c_ok = (255 * np.abs(W[:, sets]).sum(axis=2) <= 32767)
    # oracle (c): the actual i16 sums of (a + 128) * w fit, for these very rows
    sums = np.einsum('rsk,jsk->rjs', (A[:, sets] + 128), W[:, sets])
    oracle = (np.abs(sums) <= 32767)
    # a block: 6 rows x 64 outputs x 64 sets (512 inputs)
    def blocks(ok_rows=None, ok_cols=None, ok_rjs=None):
        n, good = 0, 0
        for r0 in range(0, 6 * 64, 6):
            for s0 in range(0, sets.shape[0], 64):
                n += 1
                if ok_rjs is not None:
                    good += ok_rjs[r0:r0 + 6, :, s0:s0 + 64].all()
                elif ok_rows is not None:
                    good += ok_rows[r0:r0 + 6, s0:s0 + 64].all()
                else:
                    good += ok_cols[:, s0:s0 + 64].all()
        return good / n
    res[name] = dict(
        set_b=b_ok.mean(), set_c=c_ok.mean(), set_oracle=oracle.mean(),
        block_b=blocks(ok_rows=b_ok), block_c=blocks(ok_cols=c_ok), block_oracle=blocks(ok_rjs=oracle))
for k, v in res.items():
    print(k, {a: round(float(b), 4) for a, b in v.items()})
