//! The MTP proposer: the trunk's own multi-token-prediction head drafts the next tokens.

use std::sync::Arc;

use mtplx_kv::{CacheFactory, KvCache};
use mtplx_model::mtp::MtpRunner;
use mtplx_model::sampling::{argmax, Distribution, Rng};
use mtplx_model::LanguageModel;

use crate::draft_model::DraftSampling;
use crate::error::Result;
use crate::proposer::{Draft, DraftContext, DraftSource, Proposer, TrunkRows};

/// Drafts with an MTP head ([`mtplx_model::mtp::MtpHead`] on the CPU, or any other
/// [`MtpRunner`]) fed by the trunk's last hidden states.
///
/// The head keeps its own one-layer KV cache: one row per position `p` whose trunk hidden
/// state `h_p` and next token `t_{p+1}` it has seen ([`Proposer::observe`], called by the
/// decoder after every forward pass with the rows it kept). The output for the newest
/// observed position scores the first draft token; each further token runs the head once
/// more on its own output (`h'`) and the token it just drafted. Draft rows are dropped from
/// the head's cache after each proposal, and replaced by the trunk's rows once verified.
///
/// Observing is lazy: rows wait in `pending` until a proposal needs them, and then go
/// through the head in one pass. When another proposer drafts most steps
/// ([`LookupThenMtp`] on a code edit), the head catches up on several steps' rows at once
/// (one pass over its weights instead of one per step). The head's kernels are
/// batch-invariant, so the drafts are the same bits either way.
pub struct MtpProposer<'a> {
    trunk: &'a dyn LanguageModel,
    head: Arc<dyn MtpRunner>,
    cache: Box<dyn KvCache>,
    /// Absolute position of the cache's first row (the head may start mid-sequence).
    base: usize,
    /// The head's output for the newest observed position, its scores, that position, and
    /// the token after it (what the first draft is picked from and continues from).
    newest: Option<Newest>,
    sampling: DraftSampling,
    rng: Rng,
    /// Observed rows not yet run through the head.
    pending: Option<Pending>,
}

#[derive(Clone)]
struct Newest {
    x: Vec<f32>,
    logits: Vec<f32>,
    pos: usize,
    last: u32,
}

/// Trunk rows waiting for the head: positions `pos..pos + next.len()`.
#[derive(Clone)]
struct Pending {
    pos: usize,
    hidden: Vec<f32>,
    next: Vec<u32>,
}

impl<'a> MtpProposer<'a> {
    /// A proposer drafting with `head`, whose one-layer cache `factory` builds (on the
    /// device the head runs on).
    pub fn new(
        trunk: &'a dyn LanguageModel,
        head: Arc<dyn MtpRunner>,
        factory: &CacheFactory,
        sampling: DraftSampling,
    ) -> Self {
        let cache = factory.new_cache(head.kv_shape());
        let seed = match sampling {
            DraftSampling::Random(r) => r.seed,
            DraftSampling::Greedy => 0,
        };
        MtpProposer {
            trunk,
            head,
            cache,
            base: 0,
            newest: None,
            sampling,
            rng: Rng::new(seed),
            pending: None,
        }
    }

    /// An independent copy (the head's cache forked), e.g. of a proposer that has observed
    /// a shared prompt.
    pub fn fork(&self) -> Self {
        MtpProposer {
            trunk: self.trunk,
            head: self.head.clone(),
            cache: self.cache.fork(),
            base: self.base,
            newest: self.newest.clone(),
            sampling: self.sampling,
            rng: self.rng.clone(),
            pending: self.pending.clone(),
        }
    }

    /// Positions the head has observed (run or pending).
    pub fn observed(&self) -> usize {
        match &self.pending {
            Some(p) => p.pos + p.next.len(),
            None => self.base + self.cache.len(),
        }
    }

    /// Runs the pending rows through the head.
    fn flush(&mut self) -> Result<()> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let n = p.next.len();
        // Keep the cache contiguous with the new rows: drop what they replace, and start
        // afresh after a gap (RoPE is relative, so a late start only loses context).
        let cached = self.base + self.cache.len();
        if p.pos < self.base || p.pos > cached {
            self.cache.truncate(0);
            self.base = p.pos;
        } else {
            self.cache.truncate(p.pos - self.base);
        }
        if p.pos + n > self.head.max_positions() {
            self.newest = None;
            return Ok(());
        }
        let (x, logits) =
            self.head
                .last_row(self.trunk, &p.hidden, &p.next, self.cache.as_mut(), p.pos)?;
        self.newest = Some(Newest {
            x,
            logits,
            pos: p.pos + n - 1,
            last: p.next[n - 1],
        });
        Ok(())
    }

    fn pick(&mut self, logits: &[f32], dists: &mut Option<Vec<Distribution>>) -> Result<u32> {
        Ok(match self.sampling {
            DraftSampling::Greedy => self.head.token_of(argmax(logits) as usize),
            DraftSampling::Random(r) => {
                let mut q = r.distribution(logits);
                for t in q.tokens.iter_mut() {
                    *t = self.head.token_of(*t as usize);
                }
                let t = self.rng.draw(&q);
                dists.as_mut().expect("random drafts carry q").push(q);
                t
            }
        })
    }
}

impl Proposer for MtpProposer<'_> {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, rows: &TrunkRows<'_>) -> Result<()> {
        if rows.next.is_empty() {
            return Ok(());
        }
        let h = self.head.hidden_size();
        match &mut self.pending {
            // Continues (or rewrites the tail of) the pending rows.
            Some(p) if rows.pos >= p.pos && rows.pos <= p.pos + p.next.len() => {
                let keep = rows.pos - p.pos;
                p.next.truncate(keep);
                p.hidden.truncate(keep * h);
                p.next.extend_from_slice(rows.next);
                p.hidden.extend_from_slice(rows.hidden);
                self.head.prepare_trunk_rows(&mut p.hidden[keep * h..]);
            }
            // Rows before the pending ones replace them; rows after a gap start afresh.
            // Either way the pending rows would be dropped by the cache before use.
            _ => {
                let mut hidden = rows.hidden.to_vec();
                self.head.prepare_trunk_rows(&mut hidden);
                self.pending = Some(Pending {
                    pos: rows.pos,
                    hidden,
                    next: rows.next.to_vec(),
                });
            }
        }
        // The newest output is stale until the pending rows are run.
        self.newest = None;
        Ok(())
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> Result<Draft> {
        self.flush()?;
        let random = matches!(self.sampling, DraftSampling::Random(_));
        let mut draft = Draft {
            tokens: Vec::new(),
            dists: random.then(Vec::new),
        };
        // The newest observation must be for the context's newest token.
        let Some(Newest {
            mut x,
            mut logits,
            pos,
            last,
        }) = self.newest.clone()
        else {
            return Ok(draft);
        };
        let n = ctx.tokens.len();
        if ctx.max_len == 0 || pos + 2 != n || ctx.tokens[n - 1] != last {
            return Ok(draft);
        }
        let k = ctx
            .max_len
            .min(self.head.max_positions().saturating_sub(pos + 1));
        let keep = self.cache.len();
        for i in 0..k {
            let t = self.pick(&logits, &mut draft.dists)?;
            draft.tokens.push(t);
            if i + 1 < k {
                (x, logits) =
                    self.head
                        .last_row(self.trunk, &x, &[t], self.cache.as_mut(), pos + 1 + i)?;
            }
        }
        self.cache.truncate(keep);
        Ok(draft)
    }
}

/// Prompt lookup when the context's tail matched earlier text, the MTP head otherwise: the
/// lookup wins on copies (code edits), the head on fresh text. Both see every observation.
/// Like the head, it follows one token stream (the context only grows between calls).
pub struct LookupThenMtp<'a> {
    pub lookup: crate::PromptLookup,
    pub mtp: MtpProposer<'a>,
    /// Shortest lookup draft preferred to the head's.
    pub min_lookup: usize,
    /// The lookup [`Proposer::next_source`] made, for the [`Proposer::propose`] after it:
    /// the context's length, the `max_len` asked, the continuation found. (The continuation
    /// for a smaller `max_len` is its prefix.)
    found: Option<(usize, usize, Vec<u32>)>,
}

impl<'a> LookupThenMtp<'a> {
    /// Prompt lookup with its default n-grams, preferred when it drafts 2 tokens or more.
    pub fn new(mtp: MtpProposer<'a>) -> Self {
        LookupThenMtp {
            lookup: crate::PromptLookup::default(),
            mtp,
            min_lookup: 2,
            found: None,
        }
    }
}

impl Proposer for LookupThenMtp<'_> {
    fn name(&self) -> &'static str {
        "lookup+mtp"
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, rows: &TrunkRows<'_>) -> Result<()> {
        self.mtp.observe(rows)
    }

    fn next_source(&mut self, ctx: &DraftContext<'_>) -> DraftSource {
        let tokens = self.lookup.lookup(ctx.tokens, ctx.max_len);
        let source = match self.is_hit(tokens.len(), ctx.max_len) {
            true => DraftSource::Lookup,
            false => DraftSource::Model,
        };
        self.found = Some((ctx.tokens.len(), ctx.max_len, tokens));
        source
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> Result<Draft> {
        // The lookup `next_source` just made, unless the context has moved since.
        let mut tokens = match self.found.take() {
            Some((len, max, found)) if len == ctx.tokens.len() && max >= ctx.max_len => found,
            _ => self.lookup.lookup(ctx.tokens, ctx.max_len),
        };
        tokens.truncate(ctx.max_len);
        match self.is_hit(tokens.len(), ctx.max_len) {
            true => Ok(Draft {
                tokens,
                dists: None,
            }),
            false => self.mtp.propose(ctx),
        }
    }
}

impl LookupThenMtp<'_> {
    /// Whether a lookup draft of `found` tokens is preferred to the head's.
    fn is_hit(&self, found: usize, max_len: usize) -> bool {
        found >= self.min_lookup.min(max_len).max(1)
    }
}
