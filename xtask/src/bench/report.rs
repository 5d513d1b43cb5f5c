//! What the agent replay's results say: turns read from the client's JSON, the invariants
//! checked on them, and the Markdown report.
//!
//! The checks are the same in `--quick` and full runs and never look at a timing: every
//! turn answered, returning turns restored (the turn after the SIGKILL from the SSD tier),
//! nothing lost, the replay repeated byte for byte, the re-prefill baseline giving the same
//! answers without reusing anything, and speculation giving plain decoding's answers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One turn as the client saw it, with what the server's request log said of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    pub step: usize,
    pub session: String,
    /// The session's own turn number (0: its first).
    pub turn: usize,
    pub kind: String,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub ttft_s: f64,
    pub decode_tok_s: Option<f64>,
    /// Prompt tokens computed (not reused) per second of TTFT, as the client saw them.
    pub prefill_tok_s: Option<f64>,
    pub text: String,
    /// mtplx's `session_restore_mode` (none for the peer).
    pub restore_mode: Option<String>,
    pub restore_s: Option<f64>,
    pub miss_reason: Option<String>,
    /// HTTP status in mtplx's request log.
    pub status: Option<u64>,
    pub ssd_used_bytes: Option<u64>,
    pub entries_lost: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub rss_peak_bytes: Option<u64>,
    /// This turn came right after the server was killed and restarted.
    pub after_restart: bool,
    pub proposer: Option<String>,
    pub acceptance: Option<f64>,
}

impl Turn {
    fn from_json(v: &Value) -> Result<Turn> {
        let u = |k: &str| v.get(k).and_then(Value::as_u64);
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        Ok(Turn {
            step: u("step").context("a turn without `step`")? as usize,
            session: s("session").unwrap_or_default(),
            turn: u("turn").unwrap_or(0) as usize,
            kind: s("kind").unwrap_or_default(),
            prompt_tokens: u("prompt_tokens"),
            cached_tokens: u("cached_tokens"),
            ttft_s: f("ttft_s").context("a turn without `ttft_s`")?,
            decode_tok_s: f("decode_tok_s"),
            prefill_tok_s: f("prefill_tok_s"),
            text: s("text").unwrap_or_default(),
            restore_mode: s("session_restore_mode"),
            restore_s: f("restore_s"),
            miss_reason: s("cache_miss_reason"),
            status: u("status"),
            ssd_used_bytes: u("ssd_used_bytes"),
            entries_lost: u("entries_lost"),
            rss_bytes: u("rss_bytes"),
            rss_peak_bytes: u("rss_peak_bytes"),
            after_restart: v.get("restart").is_some_and(|r| !r.is_null()),
            proposer: s("proposer"),
            acceptance: f("mean_acceptance_length"),
        })
    }

    /// Whether the turn's prefix came from the SSD tier.
    pub fn restored_from_ssd(&self) -> bool {
        self.restore_mode
            .as_deref()
            .is_some_and(|m| m.starts_with("ssd"))
    }
}

/// One server's pass over the scenario.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    pub turns: Vec<Turn>,
    /// (seconds since the server first started, resident bytes), sampled.
    pub rss: Vec<(f64, u64)>,
}

impl Run {
    fn from_json(v: &Value) -> Result<Run> {
        let turns = v
            .get("turns")
            .and_then(Value::as_array)
            .context("a run without `turns`")?
            .iter()
            .map(Turn::from_json)
            .collect::<Result<_>>()?;
        let rss = v
            .get("rss")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Run { turns, rss })
    }

    /// Turns of a session after its first: the ones a cache can serve.
    pub fn returning(&self) -> impl Iterator<Item = &Turn> {
        self.turns.iter().filter(|t| t.turn > 0)
    }
}

/// Everything the client measured in one `agent_replay.py` run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Results {
    /// The replay as users run mtplx, once or twice (repeatability).
    pub replay: Vec<Run>,
    /// The step before which the server was killed and restarted.
    pub kill_before: Option<usize>,
    pub reprefill: Option<Run>,
    pub peer: Option<Run>,
    /// Decoding configuration → its turns (same steps in each).
    pub decoding: BTreeMap<String, Vec<Turn>>,
    pub steps: usize,
    /// llama.cpp's server command line, and why it differs from the defaults where it does.
    pub peer_command: Vec<String>,
    pub peer_notes: Vec<String>,
    pub args: Value,
    pub source: String,
}

impl Results {
    pub fn from_json(v: &Value) -> Result<Results> {
        let replay: Vec<Run> = match v.get("replay").and_then(Value::as_array) {
            Some(runs) => runs.iter().map(Run::from_json).collect::<Result<_>>()?,
            None => Vec::new(),
        };
        let kill_before = v
            .get("replay")
            .and_then(|r| r.get(0))
            .and_then(|r| r.get("kill_before_step"))
            .and_then(Value::as_u64)
            .map(|k| k as usize);
        let opt_run = |k: &str| v.get(k).map(Run::from_json).transpose();
        let mut decoding = BTreeMap::new();
        if let Some(d) = v.get("decoding").and_then(Value::as_object) {
            for (name, turns) in d {
                let turns = turns
                    .as_array()
                    .context("decoding turns")?
                    .iter()
                    .map(Turn::from_json)
                    .collect::<Result<_>>()?;
                decoding.insert(name.clone(), turns);
            }
        }
        let scenario = v.get("scenario");
        let steps = scenario
            .and_then(|s| s.get("steps"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let source = scenario
            .and_then(|s| {
                Some(format!(
                    "{} files under {}",
                    s.get("source_files")?.as_u64()?,
                    s.get("source_root")?.as_str()?
                ))
            })
            .unwrap_or_default();
        let strings = |k: &str| -> Vec<String> {
            v.get("peer")
                .and_then(|p| p.get(k))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Results {
            peer_command: strings("command"),
            peer_notes: strings("notes"),
            replay,
            kill_before,
            reprefill: opt_run("reprefill")?,
            peer: opt_run("peer")?,
            decoding,
            steps,
            args: v.get("args").cloned().unwrap_or(Value::Null),
            source,
        })
    }
}

/// One invariant and whether the run kept it.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

fn check(name: &'static str, failures: Vec<String>, passed: String) -> Check {
    let ok = failures.is_empty();
    let detail = if ok {
        passed
    } else {
        let shown: Vec<_> = failures.iter().take(4).cloned().collect();
        format!("{} failure(s): {}", failures.len(), shown.join("; "))
    };
    Check { name, ok, detail }
}

/// Steps whose texts differ between `a` and `b`, and whether their lengths match.
fn differing(a: &Run, b: &Run) -> Vec<String> {
    let mut out = Vec::new();
    if a.turns.len() != b.turns.len() {
        out.push(format!("{} turns vs {}", a.turns.len(), b.turns.len()));
    }
    for (x, y) in a.turns.iter().zip(&b.turns) {
        if x.text != y.text {
            out.push(format!("step {} differs", x.step + 1));
        }
    }
    out
}

/// The invariants, on whatever parts the run has.
pub fn checks(r: &Results) -> Vec<Check> {
    let mut out = Vec::new();
    let mtplx_runs: Vec<(&str, &Run)> = r
        .replay
        .iter()
        .map(|run| ("replay", run))
        .chain(r.reprefill.iter().map(|run| ("re-prefill", run)))
        .collect();
    let mut failures = Vec::new();
    let mut n = 0;
    for (name, run) in &mtplx_runs {
        if run.turns.len() != r.steps {
            failures.push(format!("{name}: {} of {} turns", run.turns.len(), r.steps));
        }
        for t in &run.turns {
            n += 1;
            if t.status != Some(200) {
                failures.push(format!("{name} step {}: status {:?}", t.step + 1, t.status));
            }
        }
    }
    out.push(check(
        "every turn answered (200, no 5xx)",
        failures,
        format!("{n} turns"),
    ));

    if let Some(first) = r.replay.first() {
        let mut failures = Vec::new();
        for (i, run) in r.replay.iter().enumerate() {
            for t in run.returning() {
                if t.cached_tokens.unwrap_or(0) == 0
                    || t.restore_mode.as_deref().is_none_or(|m| m == "cold")
                {
                    failures.push(format!(
                        "replay {} step {}: {:?} ({:?})",
                        i + 1,
                        t.step + 1,
                        t.restore_mode,
                        t.miss_reason
                    ));
                }
            }
        }
        let modes = mode_counts(first);
        out.push(check(
            "returning turns restored",
            failures,
            format!("restore modes: {}", modes_line(&modes)),
        ));

        let mut failures = Vec::new();
        match r.kill_before {
            None => failures.push("no restart in the replay".into()),
            Some(k) => {
                for (i, run) in r.replay.iter().enumerate() {
                    match run.turns.iter().find(|t| t.step == k) {
                        Some(t) if t.after_restart && t.restored_from_ssd() => {}
                        Some(t) => failures.push(format!(
                            "replay {} step {}: {:?} after restart {}",
                            i + 1,
                            k + 1,
                            t.restore_mode,
                            t.after_restart
                        )),
                        None => failures.push(format!("replay {}: no step {}", i + 1, k + 1)),
                    }
                }
            }
        }
        out.push(check(
            "after SIGKILL and restart, the next turn restores from the SSD tier",
            failures,
            format!("step {}", r.kill_before.map_or(0, |k| k + 1)),
        ));

        let lost: Vec<String> = r
            .replay
            .iter()
            .flat_map(|run| &run.turns)
            .filter(|t| t.entries_lost.unwrap_or(0) > 0)
            .map(|t| format!("step {}: {:?} lost", t.step + 1, t.entries_lost))
            .collect();
        out.push(check(
            "no conversation lost",
            lost,
            "entries_lost 0 throughout".into(),
        ));

        if let Some(second) = r.replay.get(1) {
            out.push(check(
                "repeatable: the replay twice, byte for byte",
                differing(first, second),
                format!("{} answers equal", first.turns.len()),
            ));
        }
        if let Some(cold) = &r.reprefill {
            out.push(check(
                "same answers whichever way the prefix arrived (replay = re-prefill)",
                differing(first, cold),
                format!("{} answers equal", first.turns.len()),
            ));
            let reused: Vec<String> = cold
                .turns
                .iter()
                .filter(|t| t.cached_tokens.unwrap_or(0) > 0)
                .map(|t| format!("step {} reused {:?}", t.step + 1, t.cached_tokens))
                .collect();
            out.push(check(
                "the re-prefill baseline reuses nothing",
                reused,
                "cached 0 on every turn".into(),
            ));
        }
    }

    if let Some(plain) = r.decoding.get("plain") {
        let mut failures = Vec::new();
        for (name, turns) in r.decoding.iter().filter(|(n, _)| *n != "plain") {
            for (p, t) in plain.iter().zip(turns) {
                if p.text != t.text {
                    failures.push(format!("{name} step {}", t.step + 1));
                }
            }
        }
        out.push(check(
            "speculation gives plain decoding's answers",
            failures,
            format!("{} configurations", r.decoding.len()),
        ));
    }
    out
}

/// How many turns took each restore mode.
pub fn mode_counts(run: &Run) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in &run.turns {
        *m.entry(t.restore_mode.clone().unwrap_or_else(|| "?".into()))
            .or_insert(0) += 1;
    }
    m
}

fn modes_line(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fails with every broken invariant.
pub fn require(checks: &[Check]) -> Result<()> {
    let failed: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
    if failed.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = failed
        .iter()
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    bail!(
        "{} invariant(s) broken:\n{}",
        failed.len(),
        lines.join("\n")
    )
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The median TTFT of a run's returning turns, the restart turn left out.
pub fn returning_ttft(run: &Run, kill_before: Option<usize>) -> Option<f64> {
    median(
        run.returning()
            .filter(|t| Some(t.step) != kill_before)
            .map(|t| t.ttft_s)
            .collect(),
    )
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{x:.digits$}"))
}

fn mb(v: Option<u64>) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{:.0}", x as f64 / 1e6))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
        _ => "–".into(),
    }
}

/// Where and how the run was made: the report's header.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub model: String,
    pub command: String,
    pub quick: bool,
    pub plots: Vec<(String, String)>,
}

/// The Markdown report.
pub fn markdown(r: &Results, checks: &[Check], cx: &Header) -> String {
    let mut s = String::new();
    let a = &r.args;
    let arg = |k: &str| a.get(k).map_or_else(String::new, |v| v.to_string());
    let _ = writeln!(
        s,
        "# Agent-session replay{}\n",
        if cx.quick { " (quick)" } else { "" }
    );
    let _ = writeln!(
        s,
        "{}, commit `{}`, {}. Model `{}`, {} threads, a {}-token window, {} tokens a turn \
         at most, seed {}. Tool results: {}. Regenerate with `{}`.\n",
        cx.date,
        cx.commit,
        cx.machine,
        cx.model,
        arg("threads"),
        arg("window"),
        arg("gen"),
        arg("seed"),
        r.source,
        cx.command
    );
    s.push_str(
        "One client (the `openai` SDK, streaming chat completions, temperature 0) replays a \
         coding agent: two sessions sharing a system prompt with tool definitions, interleaved, \
         each turn a tool result (a file, a grep, a listing, a command's output), a think time \
         of 0-3 s between turns. mtplx runs as users run it, its RAM bank capped at one entry \
         so that each switch of session sends the other to the SSD tier; between two turns it is \
         killed (SIGKILL) and restarted. The re-prefill baseline is the same server with its \
         session cache off; the peer is llama.cpp's `llama-server` on the same file and threads, \
         its prompt cache on. All of it in one run, one server at a time; ratios are within this \
         run.\n\n",
    );

    s.push_str("## Invariants\n\n| check | result | detail |\n|---|---|---|\n");
    for c in checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            c.name,
            if c.ok { "ok" } else { "**FAILED**" },
            c.detail
        );
    }
    s.push('\n');

    if let Some(run) = r.replay.first() {
        s.push_str("## Returning turns\n\n");
        let m = returning_ttft(run, r.kill_before);
        let cold = r
            .reprefill
            .as_ref()
            .and_then(|c| returning_ttft(c, r.kill_before));
        let peer = r
            .peer
            .as_ref()
            .and_then(|c| returning_ttft(c, r.kill_before));
        s.push_str("| median TTFT of a returning turn | seconds | vs mtplx |\n|---|---|---|\n");
        let _ = writeln!(s, "| mtplx (bank + SSD tier) | {} | 1.0x |", opt(m, 3));
        let _ = writeln!(
            s,
            "| mtplx, session cache off (re-prefill) | {} | {} |",
            opt(cold, 3),
            ratio(cold, m)
        );
        let _ = writeln!(
            s,
            "| llama.cpp server, prompt cache on | {} | {} |",
            opt(peer, 3),
            ratio(peer, m)
        );
        if !r.peer_command.is_empty() {
            // The binary's and the model's folders say nothing: keep the file names.
            let shown: Vec<&str> = r
                .peer_command
                .iter()
                .map(|a| a.rsplit('/').next().unwrap_or(a))
                .collect();
            let _ = write!(s, "\nllama.cpp ran as `{}`", shown.join(" "));
            if r.peer_notes.is_empty() {
                s.push_str(".\n");
            } else {
                let _ = writeln!(s, " ({}).", r.peer_notes.join("; "));
            }
        }
        if let Some(k) = r.kill_before {
            let at = |run: Option<&Run>| {
                run.and_then(|x| x.turns.iter().find(|t| t.step == k))
                    .map(|t| t.ttft_s)
            };
            let _ = writeln!(
                s,
                "\nThe turn after the restart (step {}): mtplx {} s ({}), re-prefill {} s, \
                 llama.cpp {} s (its server was not restarted).",
                k + 1,
                opt(at(Some(run)), 3),
                run.turns
                    .iter()
                    .find(|t| t.step == k)
                    .and_then(|t| t.restore_mode.clone())
                    .unwrap_or_default(),
                opt(at(r.reprefill.as_ref()), 3),
                opt(at(r.peer.as_ref()), 3),
            );
        }
        let peak = |run: Option<&Run>| {
            run.and_then(|x| x.turns.iter().filter_map(|t| t.rss_peak_bytes).max())
        };
        let _ = writeln!(
            s,
            "\nPeak RSS: mtplx {} MB, re-prefill {} MB, llama.cpp {} MB.",
            mb(r.replay.iter().filter_map(|x| peak(Some(x))).max()),
            mb(peak(r.reprefill.as_ref())),
            mb(peak(r.peer.as_ref())),
        );
        for (p, _) in cx.plots.iter().filter(|(_, k)| k == "ttft") {
            let _ = writeln!(s, "\n![TTFT per turn]({p})");
        }

        s.push_str("\n## Per turn\n\n");
        s.push_str(
            "TTFT in seconds; prefill and decode in tok/s as the client saw them (prefill: the \
             prompt tokens not reused, over the TTFT); SSD MB: the tier's size after the turn.\n\n\
             | step | session | turn | kind | prompt | cached | mode | restore s | TTFT mtplx | \
             re-prefill | llama.cpp | prefill mtplx | re-prefill | llama.cpp | decode mtplx | \
             llama.cpp | SSD MB | RSS MB |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for t in &run.turns {
            let other = |o: Option<&Run>| {
                o.and_then(|x| x.turns.iter().find(|u| u.step == t.step))
                    .cloned()
            };
            let (c, p) = (other(r.reprefill.as_ref()), other(r.peer.as_ref()));
            let _ = writeln!(
                s,
                "| {}{} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                t.step + 1,
                if t.after_restart { " (restart)" } else { "" },
                t.session,
                t.turn,
                t.kind,
                t.prompt_tokens.map_or("–".into(), |x| x.to_string()),
                t.cached_tokens.map_or("–".into(), |x| x.to_string()),
                t.restore_mode.clone().unwrap_or_default(),
                opt(t.restore_s, 3),
                t.ttft_s,
                opt(c.as_ref().map(|c| c.ttft_s), 3),
                opt(p.as_ref().map(|p| p.ttft_s), 3),
                opt(t.prefill_tok_s, 0),
                opt(c.and_then(|c| c.prefill_tok_s), 0),
                opt(p.as_ref().and_then(|p| p.prefill_tok_s), 0),
                opt(t.decode_tok_s, 1),
                opt(p.and_then(|p| p.decode_tok_s), 1),
                mb(t.ssd_used_bytes),
                mb(t.rss_bytes),
            );
        }
    }

    if !r.decoding.is_empty() {
        s.push_str("\n## Decoding\n\nDecode tok/s (client side, after the first token), by turn kind; the mean accepted length where drafting.\n\n| configuration | proposer | chat | code edit | accepted length |\n|---|---|---|---|---|\n");
        for (name, turns) in &r.decoding {
            let by = |k: &str| {
                median(
                    turns
                        .iter()
                        .filter(|t| t.kind == k)
                        .filter_map(|t| t.decode_tok_s)
                        .collect(),
                )
            };
            let proposer = turns
                .iter()
                .find_map(|t| t.proposer.clone())
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "| {name} | {proposer} | {} | {} | {} |",
                opt(by("chat"), 1),
                opt(by("code_edit"), 1),
                opt(
                    median(turns.iter().filter_map(|t| t.acceptance).collect()),
                    2
                )
            );
        }
        for (p, _) in cx.plots.iter().filter(|(_, k)| k == "decode") {
            let _ = writeln!(s, "\n![Decode rate by proposer]({p})");
        }
    }
    for (p, _) in cx.plots.iter().filter(|(_, k)| k == "rss") {
        let _ = writeln!(s, "\n## Memory\n\n![Server RSS over the run]({p})");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turn(step: usize, session: &str, t: usize, mode: &str, cached: u64, text: &str) -> Value {
        json!({"step": step, "session": session, "turn": t, "kind": "chat", "ttft_s": 0.5,
               "decode_tok_s": 50.0, "prompt_tokens": 1000 + step, "cached_tokens": cached,
               "text": text, "session_restore_mode": mode, "status": 200, "entries_lost": 0})
    }

    fn results() -> Value {
        let run = |with_restart: bool| {
            let mut t2 = turn(2, "main", 1, "ssd_clone", 900, "c");
            if with_restart {
                t2["restart"] = json!({"start_s": 1.0});
            }
            json!({"kill_before_step": 2, "rss": [[0.0, 1], [0.5, 2]], "turns": [
                turn(0, "main", 0, "cold", 0, "a"),
                turn(1, "side", 0, "cold", 0, "b"),
                t2,
            ]})
        };
        let cold = json!({"turns": [
            turn(0, "main", 0, "cold", 0, "a"),
            turn(1, "side", 0, "cold", 0, "b"),
            turn(2, "main", 1, "cold", 0, "c"),
        ]});
        json!({"args": {"threads": 2}, "scenario": {"steps": [{}, {}, {}]},
               "replay": [run(true), run(true)], "reprefill": cold,
               "decoding": {"plain": [turn(2, "main", 1, "", 0, "x")],
                            "prompt-lookup": [turn(2, "main", 1, "", 0, "x")]}})
    }

    fn failed(v: &Value) -> Vec<&'static str> {
        let r = Results::from_json(v).unwrap();
        checks(&r)
            .into_iter()
            .filter(|c| !c.ok)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn a_good_run_keeps_every_invariant() {
        let r = Results::from_json(&results()).unwrap();
        let c = checks(&r);
        assert_eq!(c.len(), 8, "{c:?}");
        assert!(c.iter().all(|c| c.ok), "{c:?}");
        require(&c).unwrap();
    }

    #[test]
    fn each_broken_invariant_is_named() {
        let mut v = results();
        v["replay"][1]["turns"][1]["text"] = json!("B");
        assert_eq!(failed(&v), ["repeatable: the replay twice, byte for byte"]);

        let mut v = results();
        v["reprefill"]["turns"][2]["text"] = json!("C");
        assert_eq!(
            failed(&v),
            ["same answers whichever way the prefix arrived (replay = re-prefill)"]
        );

        let mut v = results();
        v["replay"][0]["turns"][2]["session_restore_mode"] = json!("clone");
        assert_eq!(
            failed(&v),
            ["after SIGKILL and restart, the next turn restores from the SSD tier"]
        );

        let mut v = results();
        v["replay"][0]["turns"][2]["session_restore_mode"] = json!("cold");
        v["replay"][0]["turns"][2]["cached_tokens"] = json!(0);
        let f = failed(&v);
        assert!(f.contains(&"returning turns restored"), "{f:?}");

        let mut v = results();
        v["replay"][0]["turns"][0]["status"] = json!(500);
        assert_eq!(failed(&v), ["every turn answered (200, no 5xx)"]);

        let mut v = results();
        v["replay"][0]["turns"][1]["entries_lost"] = json!(1);
        assert_eq!(failed(&v), ["no conversation lost"]);

        let mut v = results();
        v["reprefill"]["turns"][2]["cached_tokens"] = json!(10);
        assert_eq!(failed(&v), ["the re-prefill baseline reuses nothing"]);

        let mut v = results();
        v["decoding"]["prompt-lookup"][0]["text"] = json!("y");
        assert_eq!(failed(&v), ["speculation gives plain decoding's answers"]);

        let mut v = results();
        v["replay"][0]["turns"].as_array_mut().unwrap().pop();
        let f = failed(&v);
        assert!(f.contains(&"every turn answered (200, no 5xx)"), "{f:?}");
        assert!(require(&checks(&Results::from_json(&v).unwrap())).is_err());
    }

    #[test]
    fn the_report_compares_returning_turns_within_the_run() {
        let mut v = results();
        v["reprefill"]["turns"][2]["ttft_s"] = json!(5.0);
        let r = Results::from_json(&v).unwrap();
        // The restart turn is left out of the median: no returning turn remains but it.
        assert_eq!(returning_ttft(&r.replay[0], r.kill_before), None);
        assert_eq!(returning_ttft(&r.replay[0], None), Some(0.5));
        let md = markdown(&r, &checks(&r), &Header::default());
        assert!(md.contains("| 3 (restart) | main | 1 | chat |"), "{md}");
        assert!(md.contains("| 0.500 | 5.000 | – |"), "{md}");
        assert!(md.contains("| plain |"), "{md}");
    }
}
