//! Real f32 kernels on slices, single-threaded (one worker thread is one CPU "device").
//!
//! GEMMs go through `matrixmultiply` (runtime-selected AVX/FMA kernels, the only `unsafe`
//! call of the CPU backend); a safe cache-blocked GEMM is kept as the reference the tests
//! compare it with. The other kernels work in place on the caller's slices.

/// Rows of C a micro-kernel tile covers.
#[cfg(test)]
const MR: usize = 4;
/// Columns of C a micro-kernel tile covers.
#[cfg(test)]
const NR: usize = 16;
/// Depth of a packed block (the shared dimension k is cut into blocks of this size).
#[cfg(test)]
const KC: usize = 256;
/// Rows of A packed at once (MC x KC stays in L2).
#[cfg(test)]
const MC: usize = 96;
/// Columns of B packed at once (KC x NC stays in L3).
#[cfg(test)]
const NC: usize = 2048;

/// `batch` independent row-major products: C[p] = A[p] . B[p], where A is `batch*m*k`,
/// B `batch*k*n` and C `batch*m*n` (C is overwritten).
pub fn gemm(batch: usize, m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm_ex(batch, m, n, k, a, false, b, false, c);
}

/// [`gemm`] with optionally transposed operands: with `trans_a` each A is stored as a
/// row-major k x m matrix and used transposed (likewise `trans_b`: B stored n x k). The
/// result is always row-major m x n.
pub fn gemm_ex(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    c: &mut [f32],
) {
    assert!(a.len() >= batch * m * k, "gemm: A holds {} elements, needs {}", a.len(), batch * m * k);
    assert!(b.len() >= batch * k * n, "gemm: B holds {} elements, needs {}", b.len(), batch * k * n);
    assert!(c.len() >= batch * m * n, "gemm: C holds {} elements, needs {}", c.len(), batch * m * n);
    if batch == 0 || m == 0 || n == 0 {
        return;
    }
    // (row stride, column stride) of each operand as used.
    let sa = if trans_a { (1, m) } else { (k, 1) };
    let sb = if trans_b { (1, k) } else { (n, 1) };
    for p in 0..batch {
        let ap = &a[p * m * k..(p + 1) * m * k];
        let bp = &b[p * k * n..(p + 1) * k * n];
        let cp = &mut c[p * m * n..(p + 1) * m * n];
        sgemm(m, n, k, ap, sa, bp, sb, cp);
    }
}

/// One product through `matrixmultiply` (runtime-selected AVX/FMA kernels).
fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    c: &mut [f32],
) {
    // The slices hold at least m*k, k*n and m*n elements (checked by `gemm_ex`), and the
    // strides address exactly those elements, so every access stays inside them.
    #[allow(unsafe_code)]
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// The same product by a safe blocked kernel: the reference the BLAS path is tested against.
#[cfg(test)]
pub(crate) fn gemm_reference(batch: usize, m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    let mut pa = vec![0.0; MC.div_ceil(MR) * MR * k.clamp(1, KC)];
    let mut pb = vec![0.0; n.min(NC).div_ceil(NR) * NR * k.clamp(1, KC)];
    for p in 0..batch {
        gemm_one(
            m,
            n,
            k,
            &a[p * m * k..],
            (k, 1),
            &b[p * k * n..],
            (n, 1),
            &mut c[p * m * n..(p + 1) * m * n],
            &mut pa,
            &mut pb,
        );
    }
}

#[cfg(test)]
/// One product C = A . B with strided operands, blocked as in BLIS/GotoBLAS.
fn gemm_one(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    c: &mut [f32],
    pa: &mut [f32],
    pb: &mut [f32],
) {
    c.fill(0.0);
    if k == 0 {
        return;
    }
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b(kc, nc, &b[pc * rsb + jc * csb..], rsb, csb, pb);
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                pack_a(mc, kc, &a[ic * rsa + pc * csa..], rsa, csa, pa);
                for jr in (0..nc).step_by(NR) {
                    let nr = NR.min(nc - jr);
                    let bpanel = &pb[jr * kc..(jr + NR) * kc];
                    for ir in (0..mc).step_by(MR) {
                        let mr = MR.min(mc - ir);
                        let apanel = &pa[ir * kc..(ir + MR) * kc];
                        let acc = micro_kernel(apanel, bpanel);
                        let row0 = ic + ir;
                        let col0 = jc + jr;
                        for (i, acc_row) in acc.iter().enumerate().take(mr) {
                            let crow = &mut c[(row0 + i) * n + col0..(row0 + i) * n + col0 + nr];
                            for (cv, &av) in crow.iter_mut().zip(acc_row) {
                                *cv += av;
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
/// MR x NR tile of A-panel . B-panel over the packed depth; the accumulators stay in registers.
#[inline(always)]
fn micro_kernel(apanel: &[f32], bpanel: &[f32]) -> [[f32; NR]; MR] {
    let mut acc = [[0.0f32; NR]; MR];
    for (av, bv) in apanel.chunks_exact(MR).zip(bpanel.chunks_exact(NR)) {
        let av: &[f32; MR] = av.try_into().expect("MR chunk");
        let bv: &[f32; NR] = bv.try_into().expect("NR chunk");
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += av[i] * bv[j];
            }
        }
    }
    acc
}

#[cfg(test)]
/// Packs an mc x kc block of A into MR-row strips, depth-major, zero-padding the last strip.
fn pack_a(mc: usize, kc: usize, a: &[f32], rsa: usize, csa: usize, pa: &mut [f32]) {
    for (s, i0) in (0..mc).step_by(MR).enumerate() {
        let strip = &mut pa[s * MR * kc..(s + 1) * MR * kc];
        let rows = MR.min(mc - i0);
        for (kk, dst) in strip.chunks_exact_mut(MR).enumerate() {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = if i < rows { a[(i0 + i) * rsa + kk * csa] } else { 0.0 };
            }
        }
    }
}

#[cfg(test)]
/// Packs a kc x nc block of B into NR-column strips, depth-major, zero-padding the last strip.
fn pack_b(kc: usize, nc: usize, b: &[f32], rsb: usize, csb: usize, pb: &mut [f32]) {
    for (s, j0) in (0..nc).step_by(NR).enumerate() {
        let strip = &mut pb[s * NR * kc..(s + 1) * NR * kc];
        let cols = NR.min(nc - j0);
        for (kk, dst) in strip.chunks_exact_mut(NR).enumerate() {
            if csb == 1 && cols == NR {
                dst.copy_from_slice(&b[kk * rsb + j0..kk * rsb + j0 + NR]);
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = if j < cols { b[kk * rsb + (j0 + j) * csb] } else { 0.0 };
                }
            }
        }
    }
}

/// Layer normalisation over rows of `width`: y = (x - mean) / sqrt(var + 1e-5) * gamma + beta.
pub fn layernorm(x: &[f32], width: usize, gamma: &[f32], beta: &[f32], y: &mut [f32]) {
    assert!(width > 0, "layernorm: width 0");
    assert_eq!(x.len(), y.len(), "layernorm: x and y differ in length");
    assert_eq!(x.len() % width, 0, "layernorm: length not a multiple of width");
    assert!(gamma.len() >= width && beta.len() >= width, "layernorm: gamma/beta shorter than width");
    let (gamma, beta) = (&gamma[..width], &beta[..width]);
    let inv_w = 1.0 / width as f32;
    for (xr, yr) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
        let mean = xr.iter().sum::<f32>() * inv_w;
        let var = xr.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() * inv_w;
        let inv_std = 1.0 / (var + 1e-5).sqrt();
        for (((yv, &xv), &g), &bt) in yr.iter_mut().zip(xr).zip(gamma).zip(beta) {
            *yv = (xv - mean) * inv_std * g + bt;
        }
    }
}

/// In-place softmax over rows of `width`, shifted by the row maximum for stability.
pub fn softmax_rows(x: &mut [f32], width: usize) {
    assert!(width > 0, "softmax_rows: width 0");
    assert_eq!(x.len() % width, 0, "softmax_rows: length not a multiple of width");
    for row in x.chunks_exact_mut(width) {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
pub fn gelu(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "gelu: x and y differ in length");
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = 0.5 * xv * (1.0 + (C * (xv + 0.044_715 * xv * xv * xv)).tanh());
    }
}

/// Inverted dropout with drop probability `p`: kept elements are scaled by 1/(1-p) and
/// marked 1 in `mask`, dropped ones are 0. Random numbers come from xorshift64* seeded by
/// `seed` (through splitmix64, so any seed, 0 included, works).
pub fn dropout(x: &[f32], p: f32, seed: u64, y: &mut [f32], mask: &mut [u8]) {
    assert_eq!(x.len(), y.len(), "dropout: x and y differ in length");
    assert_eq!(x.len(), mask.len(), "dropout: x and mask differ in length");
    assert!((0.0..=1.0).contains(&p), "dropout: p = {p} outside [0, 1]");
    if p >= 1.0 {
        y.fill(0.0);
        mask.fill(0);
        return;
    }
    let scale = 1.0 / (1.0 - p);
    // Keep when the top 32 bits of the draw are at or above p * 2^32.
    let threshold = (p as f64 * 4_294_967_296.0) as u64;
    let mut s = splitmix64(seed) | 1;
    for ((yv, &xv), mv) in y.iter_mut().zip(x).zip(mask.iter_mut()) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        let keep = r >= threshold;
        *mv = keep as u8;
        *yv = if keep { xv * scale } else { 0.0 };
    }
}

fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element-wise y = a + b.
pub fn add(a: &[f32], b: &[f32], y: &mut [f32]) {
    assert!(a.len() == y.len() && b.len() == y.len(), "add: lengths differ");
    for ((yv, &av), &bv) in y.iter_mut().zip(a).zip(b) {
        *yv = av + bv;
    }
}

/// One Adam step (Kingma & Ba 2015) with bias correction: beta1 0.9, beta2 0.999, eps 1e-8.
/// `step` counts from 1.
pub fn adam(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], step: u32, lr: f32) {
    let len = params.len();
    assert!(grads.len() == len && m.len() == len && v.len() == len, "adam: lengths differ");
    assert!(step >= 1, "adam: step counts from 1");
    const B1: f32 = 0.9;
    const B2: f32 = 0.999;
    const EPS: f32 = 1e-8;
    let bc1 = 1.0 - B1.powi(step as i32);
    let bc2 = 1.0 - B2.powi(step as i32);
    let step_size = lr / bc1;
    let inv_sqrt_bc2 = 1.0 / bc2.sqrt();
    for (((pv, &g), mv), vv) in params.iter_mut().zip(grads).zip(m.iter_mut()).zip(v.iter_mut()) {
        *mv = B1 * *mv + (1.0 - B1) * g;
        *vv = B2 * *vv + (1.0 - B2) * g * g;
        *pv -= step_size * *mv / ((*vv).sqrt() * inv_sqrt_bc2 + EPS);
    }
}

/// dst = src.
pub fn copy(src: &[f32], dst: &mut [f32]) {
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut s = splitmix64(seed) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn naive_gemm(m: usize, n: usize, k: usize, a: &[f32], ta: bool, b: &[f32], tb: bool) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    let av = if ta { a[p * m + i] } else { a[i * k + p] };
                    let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                    s += av as f64 * bv as f64;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    #[test]
    fn blas_gemm_matches_the_safe_blocked_reference() {
        for &(batch, m, n, k) in &[(1, 97, 130, 300), (3, 33, 17, 260), (2, 100, 2100, 5)] {
            let a = random(batch * m * k, 11);
            let b = random(batch * k * n, 12);
            let (mut fast, mut slow) = (vec![0.0; batch * m * n], vec![0.0; batch * m * n]);
            gemm(batch, m, n, k, &a, &b, &mut fast);
            gemm_reference(batch, m, n, k, &a, &b, &mut slow);
            for (x, y) in fast.iter().zip(&slow) {
                assert!((x - y).abs() <= 1e-3 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
    }

    #[test]
    fn gemm_matches_triple_loop() {
        // Odd sizes exercise the partial tiles; 300 and 2100 cross the KC and NC blocks.
        for &(batch, m, n, k) in
            &[(1, 1, 1, 1), (1, 5, 7, 3), (3, 13, 17, 11), (2, 33, 40, 300), (1, 7, 2100, 5), (1, 100, 9, 1)]
        {
            let a = random(batch * m * k, 1);
            let b = random(batch * k * n, 2);
            let mut c = vec![f32::NAN; batch * m * n];
            gemm(batch, m, n, k, &a, &b, &mut c);
            for p in 0..batch {
                let want = naive_gemm(m, n, k, &a[p * m * k..], false, &b[p * k * n..], false);
                for (i, (&got, &w)) in c[p * m * n..(p + 1) * m * n].iter().zip(&want).enumerate() {
                    assert!(
                        (got - w).abs() <= 1e-4 * (1.0 + k as f32).sqrt(),
                        "{batch}x{m}x{n}x{k} [{p}][{i}]: {got} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_transposed_operands() {
        let (batch, m, n, k) = (2, 19, 23, 29);
        let a = random(batch * m * k, 3);
        let b = random(batch * k * n, 4);
        for (ta, tb) in [(false, true), (true, false), (true, true)] {
            let mut c = vec![0.0f32; batch * m * n];
            gemm_ex(batch, m, n, k, &a, ta, &b, tb, &mut c);
            for p in 0..batch {
                let want = naive_gemm(m, n, k, &a[p * m * k..], ta, &b[p * k * n..], tb);
                for (&got, &w) in c[p * m * n..(p + 1) * m * n].iter().zip(&want) {
                    assert!((got - w).abs() < 1e-4, "ta {ta} tb {tb}: {got} vs {w}");
                }
            }
        }
    }

    #[test]
    fn gemm_with_k_zero_gives_zeros() {
        let mut c = vec![1.0f32; 6];
        gemm(1, 2, 3, 0, &[], &[], &mut c);
        assert!(c.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn layernorm_gives_mean_zero_variance_one() {
        let width = 64;
        let x: Vec<f32> = random(8 * width, 5).iter().map(|v| 3.0 * v + 2.0).collect();
        let mut y = vec![0.0; x.len()];
        layernorm(&x, width, &vec![1.0; width], &vec![0.0; width], &mut y);
        for row in y.chunks_exact(width) {
            let mean = row.iter().sum::<f32>() / width as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
            assert!(mean.abs() < 1e-5, "mean {mean}");
            assert!((var - 1.0).abs() < 1e-3, "var {var}");
        }
        // gamma and beta scale and shift.
        let gamma = random(width, 6);
        let beta = random(width, 7);
        let mut z = vec![0.0; x.len()];
        layernorm(&x, width, &gamma, &beta, &mut z);
        for (i, (&zv, &yv)) in z.iter().zip(&y).enumerate() {
            let j = i % width;
            assert!((zv - (yv * gamma[j] + beta[j])).abs() < 1e-5);
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_match_reference() {
        let width = 37;
        let mut x: Vec<f32> = random(5 * width, 8).iter().map(|v| 20.0 * v).collect();
        x[3] = 500.0; // would overflow exp() without the max shift
        let reference: Vec<f32> = x
            .chunks_exact(width)
            .flat_map(|row| {
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
                let e: Vec<f64> = row.iter().map(|&v| (v as f64 - max).exp()).collect();
                let s: f64 = e.iter().sum();
                e.into_iter().map(move |v| (v / s) as f32)
            })
            .collect();
        softmax_rows(&mut x, width);
        for row in x.chunks_exact(width) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
        for (&got, &want) in x.iter().zip(&reference) {
            assert!(got.is_finite() && (got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn gelu_matches_reference_points() {
        let x = [-3.0f32, -1.0, 0.0, 0.5, 1.0, 3.0];
        let mut y = [0.0f32; 6];
        gelu(&x, &mut y);
        for (&xv, &yv) in x.iter().zip(&y) {
            let xd = xv as f64;
            let want = 0.5 * xd * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            assert!((yv as f64 - want).abs() < 1e-6, "gelu({xv}) = {yv}, want {want}");
        }
    }

    #[test]
    fn dropout_keeps_about_one_minus_p_and_scales() {
        let n = 100_000;
        let x = vec![1.0f32; n];
        let mut y = vec![0.0; n];
        let mut mask = vec![0u8; n];
        dropout(&x, 0.1, 42, &mut y, &mut mask);
        let kept = mask.iter().filter(|&&m| m == 1).count();
        assert!((kept as f64 / n as f64 - 0.9).abs() < 0.01, "kept {kept}");
        for (&yv, &m) in y.iter().zip(&mask) {
            assert_eq!(yv, if m == 1 { 1.0 / 0.9 } else { 0.0 });
        }
        // Same seed, same mask; another seed, another mask.
        let (mut y2, mut mask2) = (vec![0.0; n], vec![0u8; n]);
        dropout(&x, 0.1, 42, &mut y2, &mut mask2);
        assert_eq!(mask, mask2);
        dropout(&x, 0.1, 43, &mut y2, &mut mask2);
        assert_ne!(mask, mask2);
        dropout(&x, 0.0, 0, &mut y2, &mut mask2);
        assert_eq!(y2, x);
    }

    #[test]
    fn add_and_copy() {
        let a = random(100, 9);
        let b = random(100, 10);
        let mut y = vec![0.0; 100];
        add(&a, &b, &mut y);
        assert!(y.iter().zip(a.iter().zip(&b)).all(|(&yv, (&av, &bv))| yv == av + bv));
        let mut d = vec![0.0; 100];
        copy(&a, &mut d);
        assert_eq!(a, d);
    }

    #[test]
    fn adam_matches_scalar_reference_for_three_steps() {
        let n = 50;
        let mut p = random(n, 11);
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        let (mut rp, mut rm, mut rv): (Vec<f64>, Vec<f64>, Vec<f64>) =
            (p.iter().map(|&x| x as f64).collect(), vec![0.0; n], vec![0.0; n]);
        let lr = 1e-2;
        for step in 1..=3u32 {
            let g = random(n, 100 + step as u64);
            adam(&mut p, &g, &mut m, &mut v, step, lr);
            for i in 0..n {
                let gi = g[i] as f64;
                rm[i] = 0.9 * rm[i] + 0.1 * gi;
                rv[i] = 0.999 * rv[i] + 0.001 * gi * gi;
                let mhat = rm[i] / (1.0 - 0.9f64.powi(step as i32));
                let vhat = rv[i] / (1.0 - 0.999f64.powi(step as i32));
                rp[i] -= lr as f64 * mhat / (vhat.sqrt() + 1e-8);
            }
            for i in 0..n {
                assert!((p[i] as f64 - rp[i]).abs() < 1e-5, "step {step} param {i}: {} vs {}", p[i], rp[i]);
                assert!((m[i] as f64 - rm[i]).abs() < 1e-6);
                assert!((v[i] as f64 - rv[i]).abs() < 1e-6);
            }
        }
    }
}
