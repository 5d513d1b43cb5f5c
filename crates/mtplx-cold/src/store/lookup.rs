//! Lookups answer from the manifest alone: no blob is opened.

use redb::{ReadOnlyMultimapTable, ReadOnlyTable};

use super::inner::Inner;
use crate::codec::{DecodeError, EntryBody, EntryHead};
use crate::dtype::KvDtype;
use crate::error::{db, ManifestError};
use crate::id::EntryId;
use crate::identity::{Identity, IdentityDigest};
use crate::index::{ColdCandidate, ColdLookup, ColdQuery, MatchKind};
use crate::key::{blocks_for, full_block_keys, BlockKey, TokenHasher, BLOCK_TOKENS};
use crate::manifest;
use crate::miss::MissReason;
use crate::miss::RestoreErrorKind;

/// Most entries sharing a block that a block-prefix lookup considers.
const MAX_BLOCK_CANDIDATES: usize = 64;

pub(crate) fn lookup(inner: &Inner, q: &ColdQuery<'_>) -> ColdLookup {
    lookup_manifest(inner, q)
        .unwrap_or_else(|_| ColdLookup::miss(MissReason::RestoreError(RestoreErrorKind::Manifest)))
}

struct Tables {
    lengths: ReadOnlyTable<([u8; 32], u32), u64>,
    heads: ReadOnlyTable<u64, &'static [u8]>,
    bodies: ReadOnlyTable<u64, &'static [u8]>,
    by_hash: ReadOnlyTable<[u8; 32], u64>,
    block_entries: ReadOnlyMultimapTable<[u8; 32], u64>,
}

fn lookup_manifest(inner: &Inner, q: &ColdQuery<'_>) -> Result<ColdLookup, ManifestError> {
    if q.prompt.is_empty() {
        return Ok(ColdLookup::miss(MissReason::EmptyLookup));
    }
    let identity = q.identity.digest();
    let r = inner.manifest().db.begin_read().map_err(db)?;
    let t = Tables {
        lengths: r.open_table(manifest::LENGTHS).map_err(db)?,
        heads: r.open_table(manifest::HEADS).map_err(db)?,
        bodies: r.open_table(manifest::BODIES).map_err(db)?,
        by_hash: r.open_table(manifest::BY_HASH).map_err(db)?,
        block_entries: r.open_multimap_table(manifest::BLOCK_ENTRIES).map_err(db)?,
    };
    let lengths = stored_lengths(&t, &identity)?;
    let found = match lengths.is_empty() {
        true => ColdLookup::miss(MissReason::EmptyLookup),
        false => ColdLookup {
            exact: exact(&t, q, &identity, &lengths)?,
            block: block(&t, q, &identity)?,
        },
    };
    // Nothing of this identity matched at all: is the prompt stored as another type?
    let unmatched = |r: &Result<ColdCandidate, MissReason>| {
        matches!(r, Err(MissReason::EmptyLookup | MissReason::PrefixMiss))
    };
    if unmatched(&found.exact) && unmatched(&found.block) && stored_as_another_dtype(&t, q)? {
        return Ok(ColdLookup::miss(MissReason::KvFormatMismatch));
    }
    Ok(found)
}

/// The distinct entry lengths stored under `identity`, ascending.
fn stored_lengths(t: &Tables, identity: &IdentityDigest) -> Result<Vec<u32>, ManifestError> {
    let range = t
        .lengths
        .range((identity.0, 0)..=(identity.0, u32::MAX))
        .map_err(db)?;
    let mut out = Vec::new();
    for row in range {
        out.push(row.map_err(db)?.0.value().1);
    }
    Ok(out)
}

/// Whether the prompt's exact prefix, or its first block (an entry holds every block of its
/// chain, so any shared block means the first is shared), is stored under the query's
/// identity with another K/V element type. From the indexes alone: no record is decoded, no
/// blob opened.
fn stored_as_another_dtype(t: &Tables, q: &ColdQuery<'_>) -> Result<bool, ManifestError> {
    for kv_dtype in KvDtype::ALL {
        if kv_dtype == q.identity.kv_dtype {
            continue;
        }
        let other = Identity {
            kv_dtype,
            ..q.identity.clone()
        }
        .digest();
        let mut hasher = TokenHasher::new(&other);
        for len in stored_lengths(t, &other)? {
            let len = len as usize;
            if len == 0 || len > q.prompt.len() {
                continue;
            }
            if t.by_hash
                .get(hasher.prefix(q.prompt, len).0)
                .map_err(db)?
                .is_some()
            {
                return Ok(true);
            }
        }
        if let Some(first) = q.prompt.get(..BLOCK_TOKENS) {
            let key = BlockKey::chain(&other, &BlockKey::ROOT, first);
            if !t.block_entries.get(key.0).map_err(db)?.is_empty() {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

enum Head {
    Ok(EntryHead),
    Foreign,
    Gone,
}

fn head(t: &Tables, id: u64) -> Result<Head, ManifestError> {
    let Some(bytes) = t.heads.get(id).map_err(db)? else {
        return Ok(Head::Gone);
    };
    Ok(match EntryHead::decode(bytes.value()) {
        Ok(h) => Head::Ok(h),
        Err(DecodeError::Version(_)) | Err(_) => Head::Foreign,
    })
}

/// Where a restore of `head` covering `covered` prompt tokens can stop: `covered` for an
/// attention-only entry, the newest checkpoint at or below it for a hybrid one.
fn restore_point(head: &EntryHead, covered: usize) -> Option<usize> {
    match &head.checkpoints {
        None => Some(covered),
        Some(cps) => cps
            .iter()
            .map(|c| c.position as usize)
            .filter(|&p| p > 0 && p <= covered)
            .max(),
    }
}

fn candidate(
    id: u64,
    head: &EntryHead,
    kind: MatchKind,
    covered: usize,
    point: usize,
) -> ColdCandidate {
    let full = point == head.n_tokens as usize;
    let blocks: u64 = (0..blocks_for(point))
        .map(|i| manifest::block_file_len(head, i))
        .sum();
    let cp = head
        .checkpoints
        .iter()
        .flatten()
        .find(|c| c.position as usize == point)
        .map_or(0, |c| c.state.file_len);
    let tail = head.tail.filter(|_| full).map_or(0, |t| t.file_len);
    ColdCandidate {
        entry: EntryId(id),
        kind,
        identity: head.identity,
        covered,
        restore_point: point,
        entry_tokens: head.n_tokens as usize,
        checkpoints: head
            .checkpoints
            .as_ref()
            .map(|cps| cps.iter().map(|c| c.position).collect()),
        tail: full && head.tail.is_some(),
        read_bytes: blocks + cp + tail,
    }
}

/// The longest entry whose tokens are a prefix of the prompt: one token hash per distinct
/// stored length, longest first.
fn exact(
    t: &Tables,
    q: &ColdQuery<'_>,
    identity: &IdentityDigest,
    lengths: &[u32],
) -> Result<Result<ColdCandidate, MissReason>, ManifestError> {
    let mut hasher = TokenHasher::new(identity);
    let hashes: Vec<(usize, [u8; 32])> = lengths
        .iter()
        .map(|&l| l as usize)
        .filter(|&l| l > 0 && l <= q.prompt.len())
        .map(|l| (l, hasher.prefix(q.prompt, l).0))
        .collect();
    let mut miss = MissReason::PrefixMiss;
    for (len, hash) in hashes.into_iter().rev() {
        let Some(id) = t.by_hash.get(hash).map_err(db)?.map(|v| v.value()) else {
            continue;
        };
        let h = match head(t, id)? {
            Head::Ok(h) => h,
            Head::Foreign => {
                miss = MissReason::FormatMismatch;
                continue;
            }
            Head::Gone => continue,
        };
        if h.identity != *identity || h.n_tokens as usize != len {
            continue;
        }
        // The hash matched; the tokens are compared anyway: a wrong state is never offered.
        let same = match t.bodies.get(id).map_err(db)? {
            Some(b) => EntryBody::decode(b.value()).is_ok_and(|b| b.tokens == q.prompt[..len]),
            None => false,
        };
        if !same {
            continue;
        }
        match restore_point(&h, len) {
            Some(p) if h.checkpoints.is_none() || p >= q.floor => {
                return Ok(Ok(candidate(id, &h, MatchKind::ExactPrefix, len, p)));
            }
            _ => miss = MissReason::BoundaryBelowFloor,
        }
    }
    Ok(Err(miss))
}

/// The deepest block of the prompt's key chain that is stored, and the entry holding it
/// that restores furthest.
fn block(
    t: &Tables,
    q: &ColdQuery<'_>,
    identity: &IdentityDigest,
) -> Result<Result<ColdCandidate, MissReason>, ManifestError> {
    let keys = full_block_keys(identity, q.prompt);
    let stored = |d: usize| -> Result<bool, ManifestError> {
        Ok(!t.block_entries.get(keys[d - 1].0).map_err(db)?.is_empty())
    };
    // Entries hold every block of their chain, so "stored" is monotone in depth.
    let (mut lo, mut hi) = (0, keys.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if stored(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 {
        return Ok(Err(MissReason::PrefixMiss));
    }
    let covered = lo * BLOCK_TOKENS;
    let mut best: Option<(usize, u64, EntryHead)> = None;
    let mut miss = MissReason::PrefixMiss;
    for id in t
        .block_entries
        .get(keys[lo - 1].0)
        .map_err(db)?
        .take(MAX_BLOCK_CANDIDATES)
    {
        let id = id.map_err(db)?.value();
        let h = match head(t, id)? {
            Head::Ok(h) if h.identity == *identity => h,
            Head::Ok(_) | Head::Gone => continue,
            Head::Foreign => {
                miss = MissReason::FormatMismatch;
                continue;
            }
        };
        match restore_point(&h, covered) {
            Some(p) if h.checkpoints.is_none() || p >= q.floor => {
                // Furthest restore point; then the newest entry.
                if best.as_ref().is_none_or(|b| (p, id) > (b.0, b.1)) {
                    best = Some((p, id, h));
                }
            }
            _ => miss = MissReason::BoundaryBelowFloor,
        }
    }
    Ok(match best {
        Some((p, id, h)) => Ok(candidate(id, &h, MatchKind::BlockPrefix, covered, p)),
        None => Err(miss),
    })
}
