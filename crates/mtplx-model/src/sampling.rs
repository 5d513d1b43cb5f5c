//! Turning logits into tokens: penalties, temperature, top-k, top-p, min-p, seeded draws.
//!
//! Everything here is deterministic: the same logits, history and seed give the same token
//! on every run and every machine (ties are broken by the lower token id, and the random
//! generator is specified here rather than borrowed from a crate whose stream may change).

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (lowest id on ties), after penalties.
    Greedy,
    /// A draw from the transformed distribution.
    Random(RandomSampling),
}

/// Parameters of a random draw. Neutral values switch a transform off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomSampling {
    /// `> 0`.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set whose mass reaches `top_p`; 1.0 keeps all.
    pub top_p: f32,
    /// Drop tokens below `min_p` times the top probability; 0.0 keeps all.
    pub min_p: f32,
    pub seed: u64,
}

/// Penalties on tokens already seen. Neutral values switch them off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// OpenAI presence penalty: subtracted once from every generated token's logit.
    pub presence: f32,
    /// OpenAI frequency penalty: subtracted per occurrence in the generated tokens.
    pub frequency: f32,
    /// Hugging Face repetition penalty over prompt and generated tokens (1.0 = off).
    pub repetition: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties {
            presence: 0.0,
            frequency: 0.0,
            repetition: 1.0,
        }
    }
}

impl Penalties {
    pub fn is_neutral(&self) -> bool {
        *self == Penalties::default()
    }

    /// Applies the penalties to `logits` in place. `prompt` and `generated` are the token
    /// history.
    pub fn apply(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) {
        if self.is_neutral() {
            return;
        }
        if self.repetition != 1.0 {
            let mut seen = vec![false; logits.len()];
            for &t in prompt.iter().chain(generated) {
                if let Some(s) = seen.get_mut(t as usize) {
                    *s = true;
                }
            }
            for (l, _) in logits.iter_mut().zip(&seen).filter(|(_, s)| **s) {
                *l = if *l > 0.0 {
                    *l / self.repetition
                } else {
                    *l * self.repetition
                };
            }
        }
        if self.presence != 0.0 || self.frequency != 0.0 {
            let mut counts = std::collections::BTreeMap::<u32, u32>::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, c) in counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= self.presence + self.frequency * c as f32;
                }
            }
        }
    }
}

/// A probability distribution over a subset of the vocabulary, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    pub tokens: Vec<u32>,
    pub probs: Vec<f32>,
}

impl Distribution {
    /// The probability of `token` (0 when it was filtered out).
    pub fn prob(&self, token: u32) -> f32 {
        self.tokens
            .iter()
            .position(|&t| t == token)
            .map_or(0.0, |i| self.probs[i])
    }
}

impl Distribution {
    /// The token at cumulative probability `u` in `[0, 1)` (inverse CDF, in list order).
    pub fn invert(&self, u: f64) -> u32 {
        let mut acc = 0f64;
        for (t, p) in self.tokens.iter().zip(&self.probs) {
            acc += *p as f64;
            if u < acc {
                return *t;
            }
        }
        *self.tokens.last().expect("a distribution is never empty")
    }
}

/// What the sampler will pick from at one position.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Greedy: this token.
    Token(u32),
    /// Random: a draw from this distribution.
    Dist(Distribution),
}

/// The most likely token, lowest id on ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl RandomSampling {
    /// The distribution a draw is taken from, after temperature, top-k, top-p and min-p.
    pub fn distribution(&self, logits: &[f32]) -> Distribution {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        // Most likely first; ties by lower id, so the order is total and reproducible.
        idx.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        if self.top_k > 0 && self.top_k < idx.len() {
            idx.truncate(self.top_k);
        }
        let t = self.temperature.max(1e-6);
        let max = logits[idx[0] as usize];
        let mut probs: Vec<f32> = idx
            .iter()
            .map(|&i| ((logits[i as usize] - max) / t).exp())
            .collect();
        normalise(&mut probs);
        if self.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    mass += p;
                    mass >= self.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            idx.truncate(keep);
            probs.truncate(keep);
        }
        if self.min_p > 0.0 {
            let floor = probs[0] * self.min_p;
            let keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
            idx.truncate(keep);
            probs.truncate(keep);
        }
        normalise(&mut probs);
        Distribution { tokens: idx, probs }
    }
}

fn normalise(p: &mut [f32]) {
    let z: f32 = p.iter().sum();
    for v in p.iter_mut() {
        *v /= z;
    }
}

/// xoshiro256** seeded through splitmix64: a fixed, documented stream.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A token drawn from `dist`.
    pub fn draw(&mut self, dist: &Distribution) -> u32 {
        dist.invert(self.uniform())
    }
}

/// A sampler for one generation: its parameters and its random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub sampling: Sampling,
    pub penalties: Penalties,
    rng: Rng,
}

impl Sampler {
    pub fn new(sampling: Sampling, penalties: Penalties) -> Self {
        let seed = match sampling {
            Sampling::Random(r) => r.seed,
            Sampling::Greedy => 0,
        };
        Sampler {
            sampling,
            penalties,
            rng: Rng::new(seed),
        }
    }

    pub fn greedy() -> Self {
        Sampler::new(Sampling::Greedy, Penalties::default())
    }

    /// What the next token is picked from, given the history (penalties applied).
    pub fn target(&self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> Target {
        let penalised;
        let logits = if self.penalties.is_neutral() {
            logits
        } else {
            let mut l = logits.to_vec();
            self.penalties.apply(&mut l, prompt, generated);
            penalised = l;
            &penalised
        };
        match self.sampling {
            Sampling::Greedy => Target::Token(argmax(logits)),
            Sampling::Random(r) => Target::Dist(r.distribution(logits)),
        }
    }

    /// The sampler's random stream. Plain decoding takes exactly one uniform per random
    /// token, so a speculative decoder that does the same yields the same tokens.
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// Picks the next token from `logits` given the history.
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
        match self.target(logits, prompt, generated) {
            Target::Token(t) => t,
            Target::Dist(d) => self.rng.draw(&d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> RandomSampling {
        RandomSampling {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 7,
        }
    }

    #[test]
    fn greedy_breaks_ties_by_lower_id() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn filters_compose() {
        let logits = [3.0, 2.0, 1.0, 0.0, -1.0];
        let d = random(1.0, 3, 1.0, 0.0).distribution(&logits);
        assert_eq!(d.tokens, [0, 1, 2]);
        let d = random(1.0, 0, 0.5, 0.0).distribution(&logits);
        assert_eq!(d.tokens, [0]);
        let d = random(1.0, 0, 1.0, 0.3).distribution(&logits);
        assert_eq!(d.tokens, [0, 1]); // e^-1 = 0.37 >= 0.3, e^-2 < 0.3
        let total: f32 = d.probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn seeded_draws_repeat_and_follow_the_distribution() {
        let logits = [1.0f32, 0.0, -1.0];
        let r = random(1.0, 0, 1.0, 0.0);
        let mut a = Sampler::new(Sampling::Random(r), Penalties::default());
        let mut b = a.clone();
        let mut counts = [0usize; 3];
        for _ in 0..20_000 {
            let t = a.sample(&logits, &[], &[]);
            assert_eq!(t, b.sample(&logits, &[], &[]));
            counts[t as usize] += 1;
        }
        let d = r.distribution(&logits);
        for t in 0..3u32 {
            let want = d.prob(t) as f64 * 20_000.0;
            assert!((counts[t as usize] as f64 - want).abs() < 4.0 * want.sqrt() + 5.0);
        }
    }

    #[test]
    fn penalties_push_seen_tokens_down() {
        let mut l = vec![2.0, -2.0, 1.0];
        Penalties {
            presence: 0.5,
            frequency: 0.25,
            repetition: 2.0,
        }
        .apply(&mut l, &[1], &[0, 0]);
        assert_eq!(l, [2.0 / 2.0 - 0.5 - 0.5, -4.0, 1.0]);
    }
}
