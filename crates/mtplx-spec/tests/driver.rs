//! The generation driver (`mtplx_spec::drive`): what it prefills, what it shows the
//! proposer, when it stops, and that plain and speculative runs of it give the model's own
//! tokens whatever prefix the cache held.

mod common;

use std::cell::Cell;
use std::ops::ControlFlow;

use mtplx_model::sampling::Sampler;
use mtplx_spec::{
    drive, Collect, Decode, DepthPolicy, Draft, DraftContext, End, Observer, PromptLookup,
    Proposer, Request, TrunkRows,
};

use common::{cache, plain_greedy, tiny};

/// A prompt that repeats itself, so prompt lookup has drafts to offer.
fn prompt() -> Vec<u32> {
    let phrase: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 300).collect();
    phrase
        .iter()
        .chain(&phrase)
        .chain(&phrase[..9])
        .copied()
        .collect()
}

/// Records the positions of the trunk rows it is shown; drafts by prompt lookup.
#[derive(Default)]
struct Recording {
    seen: Vec<usize>,
    lookup: PromptLookup,
}

impl Proposer for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn wants_hidden(&self) -> bool {
        true
    }
    fn observe(&mut self, rows: &TrunkRows<'_>) -> mtplx_spec::Result<()> {
        self.seen.extend(rows.pos..rows.pos + rows.next.len());
        Ok(())
    }
    fn propose(&mut self, ctx: &DraftContext<'_>) -> mtplx_spec::Result<Draft> {
        self.lookup.propose(ctx)
    }
}

/// Cancels once `after` checks have passed.
struct CancelAfter {
    after: usize,
    checks: Cell<usize>,
    tokens: Vec<u32>,
}

impl Observer for CancelAfter {
    fn cancelled(&self) -> bool {
        self.checks.set(self.checks.get() + 1);
        self.checks.get() > self.after
    }
    fn token(&mut self, token: u32) -> ControlFlow<()> {
        self.tokens.push(token);
        ControlFlow::Continue(())
    }
}

#[test]
fn plain_and_speculative_give_the_models_tokens_from_any_restored_prefix() {
    let model = tiny("llama");
    let prompt = prompt();
    let n = 24;
    let (want, _) = plain_greedy(&model, &prompt, n);
    let never = |_: u32| false;
    for restored in [0, 1, 20, prompt.len() - 1, prompt.len()] {
        for speculative in [false, true] {
            let mut c = cache(&model);
            if restored > 0 {
                mtplx_model::prefill(&model, &prompt[..restored], &mut c, 7).unwrap();
            }
            let decode = if speculative {
                Decode::Speculative {
                    proposer: Box::new(PromptLookup::default()),
                    policy: DepthPolicy::fixed(3),
                }
            } else {
                Decode::Plain
            };
            let request = Request {
                chunk: 7,
                ..Request::new(&prompt, Sampler::greedy(), n, &never)
            };
            let mut seen = Collect::default();
            let r = drive(&model, &mut c, &request, decode, &mut seen).unwrap();
            let case = format!("restored {restored}, speculative {speculative}");
            assert_eq!(seen.0, want, "{case}");
            assert_eq!(r.end, End::Length, "{case}");
            assert_eq!(r.completion_tokens, n, "{case}");
            let reused = restored.min(prompt.len() - 1);
            assert_eq!(r.cached_tokens, reused, "{case}");
            assert_eq!(r.new_prefill_tokens, prompt.len() - reused, "{case}");
            assert_eq!(r.tokens[..prompt.len()], prompt[..], "{case}");
            assert_eq!(r.tokens[prompt.len()..], want[..], "{case}");
            assert_eq!(r.speculation.is_some(), speculative, "{case}");
            if let Some(s) = &r.speculation {
                assert!(s.stats.verify_calls > 0, "lookup drafted nothing: {case}");
                assert!(r.decode_steps < n as u64, "{case}");
            } else {
                assert_eq!(r.decode_steps, n as u64, "{case}");
            }
            // The cache holds every token but the newest.
            assert_eq!(c.len(), r.tokens.len() - 1, "{case}");
        }
    }
}

#[test]
fn the_proposer_sees_every_prompt_row_the_driver_computes() {
    let model = tiny("llama");
    let prompt = prompt();
    let never = |_: u32| false;
    let restored = 10;
    let mut c = cache(&model);
    mtplx_model::prefill(&model, &prompt[..restored], &mut c, 7).unwrap();
    // The driver owns its proposer: this one records into a cell the test keeps.
    struct Shared<'a>(&'a std::cell::RefCell<Recording>);
    impl Proposer for Shared<'_> {
        fn name(&self) -> &'static str {
            "recording"
        }
        fn wants_hidden(&self) -> bool {
            true
        }
        fn observe(&mut self, rows: &TrunkRows<'_>) -> mtplx_spec::Result<()> {
            self.0.borrow_mut().observe(rows)
        }
        fn propose(&mut self, ctx: &DraftContext<'_>) -> mtplx_spec::Result<Draft> {
            self.0.borrow_mut().propose(ctx)
        }
    }
    let rec = std::cell::RefCell::new(Recording::default());
    let decode = Decode::Speculative {
        proposer: Box::new(Shared(&rec)),
        policy: DepthPolicy::fixed(2),
    };
    let request = Request {
        chunk: 7,
        ..Request::new(&prompt, Sampler::greedy(), 5, &never)
    };
    let r = drive(&model, &mut c, &request, decode, &mut Collect::default()).unwrap();
    let seen = rec.borrow().seen.clone();
    // Every position from the restored prefix on, in order, once: the prompt's rows during
    // the prefill, then the answer's before each next draft (the last verify's rows are
    // shown only if another draft follows).
    let want: Vec<usize> = (restored..restored + seen.len()).collect();
    assert_eq!(seen, want);
    assert!(seen.len() > prompt.len() - restored, "{seen:?}");
    assert!(restored + seen.len() < r.tokens.len());
}

#[test]
fn a_cancellation_stops_the_prefill_within_one_chunk_and_keeps_what_was_computed() {
    let model = tiny("llama");
    let prompt = prompt();
    let never = |_: u32| false;
    let mut c = cache(&model);
    let mut obs = CancelAfter {
        after: 2,
        checks: Cell::new(0),
        tokens: Vec::new(),
    };
    let request = Request {
        chunk: 7,
        ..Request::new(&prompt, Sampler::greedy(), 8, &never)
    };
    let r = drive(&model, &mut c, &request, Decode::Plain, &mut obs).unwrap();
    assert_eq!(r.end, End::Cancelled);
    assert_eq!(r.completion_tokens, 0);
    assert!(obs.tokens.is_empty());
    assert_eq!(r.new_prefill_tokens, 14, "two chunks of 7 ran");
    assert_eq!(c.len(), 14);
    assert_eq!(r.tokens, prompt, "the prompt, whose prefix the cache holds");
    assert!(r.first_token_at.is_none());

    // Cancelled between decode steps: the tokens so far are kept.
    let mut c = cache(&model);
    let chunks = (prompt.len() - 1).div_ceil(7);
    let mut obs = CancelAfter {
        after: chunks + 3,
        checks: Cell::new(0),
        tokens: Vec::new(),
    };
    let r = drive(&model, &mut c, &request, Decode::Plain, &mut obs).unwrap();
    assert_eq!(r.end, End::Cancelled);
    assert_eq!(r.completion_tokens, 3);
    assert_eq!(obs.tokens.len(), 3);
    assert_eq!(c.len(), prompt.len() + 2);
}

#[test]
fn stops_on_a_stop_token_the_observer_the_length_or_the_window() {
    let model = tiny("llama");
    let prompt = prompt();
    let never = |_: u32| false;
    let (want, _) = plain_greedy(&model, &prompt, 12);
    let run = |request: &Request<'_>, obs: &mut dyn Observer| {
        let mut c = cache(&model);
        drive(&model, &mut c, request, Decode::Plain, obs).unwrap()
    };

    // A stop token ends it, counted but not shown.
    let stop_at = want[4];
    let first = want.iter().position(|&t| t == stop_at).unwrap();
    let is_stop = |t: u32| t == stop_at;
    let mut seen = Collect::default();
    let r = run(
        &Request::new(&prompt, Sampler::greedy(), 12, &is_stop),
        &mut seen,
    );
    assert_eq!(r.end, End::StopToken);
    assert_eq!(r.completion_tokens, first + 1);
    assert_eq!(seen.0, want[..first]);

    // The observer ends it after the token it refused.
    struct Upto(usize, Vec<u32>);
    impl Observer for Upto {
        fn token(&mut self, t: u32) -> ControlFlow<()> {
            self.1.push(t);
            if self.1.len() == self.0 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    let mut upto = Upto(3, Vec::new());
    let r = run(
        &Request::new(&prompt, Sampler::greedy(), 12, &never),
        &mut upto,
    );
    assert_eq!(r.end, End::Observer);
    assert_eq!((r.completion_tokens, upto.1.as_slice()), (3, &want[..3]));

    // The context window: prompt plus answer fill it.
    let request = Request {
        context_window: prompt.len() + 5,
        ..Request::new(&prompt, Sampler::greedy(), 12, &never)
    };
    let r = run(&request, &mut Collect::default());
    assert_eq!((r.end, r.completion_tokens), (End::ContextFull, 5));

    // An empty prompt is an error, not a panic.
    let mut c = cache(&model);
    let empty = Request::new(&[], Sampler::greedy(), 4, &never);
    assert!(drive(
        &model,
        &mut c,
        &empty,
        Decode::Plain,
        &mut Collect::default()
    )
    .is_err());
}
