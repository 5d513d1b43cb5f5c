//! Generation parameters shared by the endpoints: sampling, stop strings, token limits.

use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use serde::Deserialize;

use crate::error::ApiError;

/// Sampler defaults when a request says nothing (the original's).
pub const DEFAULT_TEMPERATURE: f32 = 0.6;
pub const DEFAULT_TOP_P: f32 = 0.95;
pub const DEFAULT_TOP_K: usize = 20;

/// The sampling fields of a request, as sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `0` or `-1` switch top-k off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
}

fn check(
    param: &str,
    v: Option<f32>,
    ok: impl Fn(f32) -> bool,
    rule: &str,
) -> Result<(), ApiError> {
    match v {
        Some(x) if !x.is_finite() || !ok(x) => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be {rule}, got {x}."),
        )),
        _ => Ok(()),
    }
}

impl SamplingParams {
    /// The sampler these parameters ask for. Temperature 0 is greedy; absent values take
    /// the defaults (temperature 0.6, top-p 0.95, top-k 20); no seed draws a fresh one.
    pub fn sampler(&self) -> Result<Sampler, ApiError> {
        check("temperature", self.temperature, |t| t >= 0.0, "at least 0")?;
        check("top_p", self.top_p, |p| p > 0.0 && p <= 1.0, "in (0, 1]")?;
        check(
            "min_p",
            self.min_p,
            |p| (0.0..=1.0).contains(&p),
            "in [0, 1]",
        )?;
        let pen = |x: f32| (-2.0..=2.0).contains(&x);
        check("presence_penalty", self.presence_penalty, pen, "in [-2, 2]")?;
        check(
            "frequency_penalty",
            self.frequency_penalty,
            pen,
            "in [-2, 2]",
        )?;
        check(
            "repetition_penalty",
            self.repetition_penalty,
            |r| r > 0.0,
            "above 0",
        )?;
        let top_k = match self.top_k {
            None => DEFAULT_TOP_K,
            Some(-1 | 0) => 0,
            Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(k) => {
                return Err(ApiError::invalid_param(
                    "top_k",
                    format!("`top_k` must be positive, or 0 or -1 for no limit, got {k}."),
                ))
            }
        };
        let penalties = Penalties {
            presence: self.presence_penalty.unwrap_or(0.0),
            frequency: self.frequency_penalty.unwrap_or(0.0),
            repetition: self.repetition_penalty.unwrap_or(1.0),
        };
        let temperature = self.temperature.unwrap_or(DEFAULT_TEMPERATURE);
        let sampling = if temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Random(RandomSampling {
                temperature,
                top_k,
                top_p: self.top_p.unwrap_or(DEFAULT_TOP_P),
                min_p: self.min_p.unwrap_or(0.0),
                seed: self.seed.map_or_else(super::random_u64, |s| s as u64),
            })
        };
        Ok(Sampler::new(sampling, penalties))
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopParam {
    One(String),
    Many(Vec<String>),
}

impl StopParam {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopParam::One(s) => vec![s],
            StopParam::Many(v) => v,
        }
    }
}

/// The stop strings of `stop`, empty ones dropped.
pub fn stop_strings(stop: Option<StopParam>) -> Vec<String> {
    stop.map(StopParam::into_vec)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
}

/// A token limit as sent: absent, or at least 1.
pub fn token_limit(param: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be at least 1, got {n}."),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_original() {
        let s = SamplingParams::default().sampler().unwrap();
        let Sampling::Random(r) = s.sampling else {
            panic!("expected random sampling")
        };
        assert_eq!(
            (r.temperature, r.top_p, r.top_k, r.min_p),
            (0.6, 0.95, 20, 0.0)
        );
        assert!(s.penalties.is_neutral());
    }

    #[test]
    fn temperature_zero_is_greedy_and_seed_is_kept() {
        let greedy = SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        };
        assert_eq!(greedy.sampler().unwrap().sampling, Sampling::Greedy);
        let seeded = SamplingParams {
            seed: Some(42),
            top_k: Some(-1),
            ..Default::default()
        };
        let Sampling::Random(r) = seeded.sampler().unwrap().sampling else {
            panic!("expected random sampling")
        };
        assert_eq!((r.seed, r.top_k), (42, 0));
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let cases = [
            SamplingParams {
                temperature: Some(-1.0),
                ..Default::default()
            },
            SamplingParams {
                top_p: Some(0.0),
                ..Default::default()
            },
            SamplingParams {
                top_p: Some(f32::NAN),
                ..Default::default()
            },
            SamplingParams {
                top_k: Some(-5),
                ..Default::default()
            },
            SamplingParams {
                min_p: Some(2.0),
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: Some(3.0),
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: Some(0.0),
                ..Default::default()
            },
        ];
        let params = [
            "temperature",
            "top_p",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "repetition_penalty",
        ];
        for (c, p) in cases.iter().zip(params) {
            let e = c.sampler().unwrap_err();
            assert_eq!(e.param.as_deref(), Some(p));
            assert_eq!(e.status, http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn token_limits_must_be_positive() {
        assert_eq!(token_limit("max_tokens", None).unwrap(), None);
        assert_eq!(token_limit("max_tokens", Some(5)).unwrap(), Some(5));
        assert!(token_limit("max_tokens", Some(0)).is_err());
        assert!(token_limit("max_tokens", Some(-3)).is_err());
    }

    #[test]
    fn stop_takes_a_string_or_a_list() {
        let one: StopParam = serde_json::from_str("\"x\"").unwrap();
        let many: StopParam = serde_json::from_str("[\"a\", \"\"]").unwrap();
        assert_eq!(stop_strings(Some(one)), ["x"]);
        assert_eq!(stop_strings(Some(many)), ["a"]);
    }
}
