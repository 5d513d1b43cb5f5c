//! Row-wise operations of the graph on plain `f32` rows.
//!
//! Each row is computed on its own in a fixed order, so a row's result never depends on
//! how many rows are processed with it.

use crate::config::RopeStyle;

/// Sum of squares with eight lanes summed in a fixed tree.
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        let xs = &x[c * 8..c * 8 + 8];
        for l in 0..8 {
            acc[l] += xs[l] * xs[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for v in &x[chunks * 8..] {
        s += v * v;
    }
    s
}

/// RMSNorm of each row of `x` (rows of `w.len()` values) into `out`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let inv = 1.0 / (sum_squares(row) / d as f32 + eps).sqrt();
        for ((o, &v), &g) in o.iter_mut().zip(row).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// RMSNorm in place.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let inv = 1.0 / (sum_squares(row) / d as f32 + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `out = silu(gate) * up` for rows of `[gate | up]` (`2 * width` values each), as the
/// fused gate/up product gives them.
pub fn silu_mul_halves(gate_up: &[f32], width: usize, out: &mut [f32]) {
    for (gu, o) in gate_up
        .chunks_exact(2 * width)
        .zip(out.chunks_exact_mut(width))
    {
        let (g, u) = gu.split_at(width);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

/// Cosine and sine tables for rotary position embeddings.
pub struct Rope {
    /// Half the rotated dimensions (`rotary_dim / 2`): the width of a table row.
    half: usize,
    /// Width of a head; the dimensions past the rotated ones pass through.
    head_dim: usize,
    style: RopeStyle,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f32, max_positions: usize, style: RopeStyle) -> Self {
        Self::partial(head_dim, head_dim, theta, max_positions, style)
    }

    /// Rotary embedding of the first `rotary_dim` dimensions of each head only (Qwen3-Next's
    /// `partial_rotary_factor`): frequencies `theta^(-2i / rotary_dim)`, pairs taken within
    /// those dimensions; the rest of the head passes through unchanged.
    pub fn partial(
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        max_positions: usize,
        style: RopeStyle,
    ) -> Self {
        let rotary_dim = rotary_dim.min(head_dim) & !1;
        let half = rotary_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for i in 0..half {
                let inv_freq = (theta as f64).powf(-((2 * i) as f64) / rotary_dim as f64);
                let a = p as f64 * inv_freq;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Rope {
            half,
            head_dim,
            style,
            cos,
            sin,
        }
    }

    /// Dimensions of each head that are rotated (the head width unless partial).
    pub fn rotary_dim(&self) -> usize {
        self.half * 2
    }

    /// The cosine and sine tables, `[max_positions, rotary_dim / 2]` each.
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    pub fn style(&self) -> RopeStyle {
        self.style
    }

    pub fn max_positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates `x` (`[n, heads, head_dim]`, row `r` at position `first_pos + r`) in place.
    pub fn apply(&self, x: &mut [f32], heads: usize, first_pos: usize) {
        let hd = self.head_dim;
        for (r, row) in x.chunks_exact_mut(heads * hd).enumerate() {
            let p = first_pos + r;
            let cos = &self.cos[p * self.half..(p + 1) * self.half];
            let sin = &self.sin[p * self.half..(p + 1) * self.half];
            for head in row.chunks_exact_mut(hd) {
                match self.style {
                    RopeStyle::Interleaved => {
                        for i in 0..self.half {
                            let (a, b) = (head[2 * i], head[2 * i + 1]);
                            head[2 * i] = a * cos[i] - b * sin[i];
                            head[2 * i + 1] = a * sin[i] + b * cos[i];
                        }
                    }
                    RopeStyle::Half => {
                        for i in 0..self.half {
                            let (a, b) = (head[i], head[i + self.half]);
                            head[i] = a * cos[i] - b * sin[i];
                            head[i + self.half] = a * sin[i] + b * cos[i];
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0, 9.0];
        let w = [0.5; 9];
        let mut out = [0.0; 9];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 9.0;
        for (o, v) in out.iter().zip(x) {
            assert!((o - v / (ms + 1e-5).sqrt() * 0.5).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_styles_agree_up_to_the_permutation() {
        // Interleaved on permuted dims equals half-style on natural dims.
        let hd = 8;
        let x: Vec<f32> = (0..hd).map(|i| i as f32 + 1.0).collect();
        let mut half = x.clone();
        Rope::new(hd, 10_000.0, 8, RopeStyle::Half).apply(&mut half, 1, 5);
        // The permutation llama.cpp applies: natural i -> interleaved 2i, i+hd/2 -> 2i+1.
        let mut inter = vec![0.0; hd];
        for i in 0..hd / 2 {
            inter[2 * i] = x[i];
            inter[2 * i + 1] = x[i + hd / 2];
        }
        Rope::new(hd, 10_000.0, 8, RopeStyle::Interleaved).apply(&mut inter, 1, 5);
        for i in 0..hd / 2 {
            assert_eq!(inter[2 * i], half[i]);
            assert_eq!(inter[2 * i + 1], half[i + hd / 2]);
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        Rope::new(4, 10_000.0, 2, RopeStyle::Half).apply(&mut x, 1, 0);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn partial_rotary_rotates_the_first_dims_as_a_narrower_head_and_passes_the_rest() {
        let (hd, rot, heads) = (16, 4, 3);
        let x: Vec<f32> = (0..2 * heads * hd)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let mut got = x.clone();
        Rope::partial(hd, rot, 10_000.0, 16, RopeStyle::Half).apply(&mut got, heads, 7);
        // The first `rot` dimensions of every head: a rope over heads `rot` wide.
        let mut narrow: Vec<f32> = x.chunks(hd).flat_map(|h| h[..rot].to_vec()).collect();
        Rope::new(rot, 10_000.0, 16, RopeStyle::Half).apply(&mut narrow, heads, 7);
        for (h, (g, x)) in got.chunks(hd).zip(x.chunks(hd)).enumerate() {
            assert_eq!(&g[..rot], &narrow[h * rot..(h + 1) * rot], "head {h}");
            assert_eq!(&g[rot..], &x[rot..], "head {h}: the tail passes through");
        }
        assert_ne!(got, x);
    }
}
