"""The printed table: every figure next to its target, met or not."""
from __future__ import annotations

from typing import Any

Row = tuple[str, str, str, str, str]


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "NOT MET")


def _throughput(r: dict[str, Any]) -> list[Row]:
    a, c, d = r["agentops"], r["celery_chain"], r["dbos"]
    rows: list[Row] = [
        ("1 throughput", f"agentops, {a['workflows']} x {a['steps']} on {a['workers']} workers",
         f"{a['steps_per_s']} steps/s", "", ""),
        ("1 throughput", "Celery chain, same shape and workers", f"{c['steps_per_s']} steps/s", "", ""),
        ("1 throughput", "agentops / Celery chain", f"{r['ratio_vs_chain']:.2f}x", ">= 0.5x",
         _met(r["ratio_vs_chain"] >= 0.5)),
    ]
    if "steps_per_s" in d:
        rows += [("1 throughput", d["label"], f"{d['steps_per_s']} steps/s", "", ""),
                 ("1 throughput", "agentops / DBOS", f"{r['ratio_vs_dbos']:.2f}x", ">= 1.0x",
                  _met(r["ratio_vs_dbos"] >= 1.0))]
    else:
        rows.append(("1 throughput", "DBOS", "skipped", ">= 1.0x", d.get("skipped", "")))
    lat = r.get("latency", {})
    if "median_s" in lat.get("agentops", {}):
        a_lat, d_lat = lat["agentops"], lat["dbos"]
        rows.append(("1 latency", f"one {a_lat['steps']}-step workflow at a time, launch -> completed, median "
                     f"of {a_lat['runs']}", f"{a_lat['median_s'] * 1000:.0f} ms", "", ""))
        if "median_s" in d_lat:
            rows += [("1 latency", "DBOS, the same", f"{d_lat['median_s'] * 1000:.0f} ms", "", ""),
                     ("1 latency", "agentops / DBOS", f"{lat['ratio_vs_dbos']:.2f}x", "", "")]
    rows += [
        ("2 cost", "PostgreSQL commits per activity", f"{a['commits_per_activity']:.2f}", "<= 3",
         _met(a["commits_per_activity"] <= 3)),
        ("2 cost", "Redis publishes per activity (LPUSH + PUBLISH)", f"{a['publishes_per_activity']:.2f}", "<= 1",
         _met(a["publishes_per_activity"] <= 1)),
        ("2 cost", "  of which task messages (LPUSH)", f"{a['task_messages_per_activity']:.2f}", "", ""),
        ("2 cost", "  of which monitoring events (PUBLISH)", f"{a['event_publishes_per_activity']:.2f}", "", ""),
        ("2 cost", "Celery chain: publishes per step", f"{c['publishes_per_activity']:.2f}", "", ""),
    ]
    if "commits_per_activity" in d:
        rows.append(("2 cost", "DBOS: commits per step", f"{d['commits_per_activity']:.2f}", "", ""))
    for ab in r.get("ablations", []):
        ratio = f", {ab['ratio_vs_chain']:.2f}x chain" if "ratio_vs_chain" in ab else ""
        rows.append(("1 ablation", ab["label"].removeprefix("agentops, "),
                     f"{ab['steps_per_s']} steps/s{ratio}, {ab['commits_per_activity']:.2f} commits, "
                     f"{ab['publishes_per_activity']:.2f} publishes", "", ""))
    return rows


def _growth(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = [("6 growth", row["label"], f"{row['steps_per_s']} steps/s, "
                        f"{row['commits_per_activity']:.2f} commits, {row['publishes_per_activity']:.2f} publishes",
                        "", "") for row in r["rows"]]
    commits = [row["commits_per_activity"] for row in r["rows"]]
    spread = max(commits) / min(commits)
    rows.append(("6 growth", "commits per activity, largest / smallest", f"{spread:.2f}", "flat (<= 1.10)",
                 _met(spread <= 1.10)))
    if r.get("one_vs_two_workers"):
        rows.append(("6 growth", "1 worker / 2 workers", f"{r['one_vs_two_workers']:.2f}x", "", ""))
    low, high = r.get("memory_activities_in_all", ["?", "?"])
    for name, m in (r.get("memory") or {}).items():
        before, after = m[f"rss_after_{low}_mb"], m[f"rss_after_{high}_mb"]
        rows.append(("6 growth", f"{name} pool RSS after {low} -> {high} activities (2 workers)",
                     f"{before} -> {after} MB ({m['growth_ratio']:.3f}x)", "<= 1.10x", _met(m["growth_ratio"] <= 1.10)))
    return rows


def _parked(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = [
        ("3 parked", "beat tick, all sweeps, none parked", f"{r['tick_ms_none']:.2f} ms", "", ""),
        ("3 parked", f"beat tick, all sweeps, {r['parked']:,} parked", f"{r['tick_ms_parked']:.2f} ms", "", ""),
        ("3 parked", "tick ratio", f"{r['ratio']:.2f}x", "<= 2x", _met(r["ratio"] <= 2)),
    ]
    rows += [("3 parked", f"  {name}", f"{v['none']['median_ms']:.2f} -> {v['parked']['median_ms']:.2f} ms "
              f"({v['ratio']:.2f}x)", "", "") for name, v in r["per_sweep"].items()]
    rows.append(("3 parked", "database bytes per parked workflow", f"{r['bytes_per_parked_workflow']:,}", "", ""))
    return rows


def _timers(r: dict[str, Any]) -> list[Row]:
    lat = r["lateness"]
    return [
        ("4 timers", f"{r['timers']} timers over {r['window_s']:.0f} s: lateness p50 / max",
         f"{lat['p50_s']:.2f} / {lat['max_s']:.2f} s", "", ""),
        ("4 timers", "lateness p99", f"{lat['p99_s']:.2f} s", f"<= {r['target_p99_s']} s",
         _met(lat["p99_s"] <= r["target_p99_s"])),
        ("4 timers", "early fires / duplicate fires", f"{r['early_fires']} / {r['duplicate_fires']}", "0 / 0",
         _met(r["early_fires"] == 0 and r["duplicate_fires"] == 0)),
        ("4 timers", "due -> workflow completed p50 / p99",
         f"{r['due_to_workflow_completed']['p50_s']:.2f} / {r['due_to_workflow_completed']['p99_s']:.2f} s", "", ""),
    ]


def _recovery(r: dict[str, Any]) -> list[Row]:
    return [
        ("5 recovery", f"{r['runs']} kills: kill -> next attempt p50", f"{r['p50_s']:.2f} s", "", ""),
        ("5 recovery", f"max (lease {r['lease_s']} s + beat {r['beat_interval_s']} s)", f"{r['max_s']:.2f} s",
         f"<= {r['bound_s']} s (<= 15)", _met(r["max_s"] <= r["bound_s"] and r["bound_s"] <= 15)),
    ]


def _profile(r: dict[str, Any]) -> list[Row]:
    return [("profile", label, f"{pct:.1f} %", "", "") for label, pct in list(r["categories_pct"].items())[:6]]


def _ablations(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = [("1 ablation", "baseline (product settings)", f"{r['baseline']['steps_per_s']} steps/s", "", "")]
    for ab in r["rows"]:
        ratio = f", {ab['ratio_vs_chain']:.2f}x chain" if "ratio_vs_chain" in ab else ""
        rows.append(("1 ablation", ab["label"].removeprefix("agentops, "),
                     f"{ab['steps_per_s']} steps/s{ratio}, {ab['commits_per_activity']:.2f} commits, "
                     f"{ab['publishes_per_activity']:.2f} publishes", "", ""))
    return rows


def _inflight(r: dict[str, Any]) -> list[Row]:
    t = r["targets"]
    rows: list[Row] = [("7 in flight", f"workers: {r['io_workers']} {r['io_pool']} x {r['io_threads_each']} "
                        f"(I/O queue, pool of {r['db_pool_size_each']} connections each) + "
                        f"{r['prefork_workers']} prefork", "", "", "")]
    for row in r["rows"]:
        n = row["agents"]
        head = f"{n} agents x {row['calls_per_agent']} calls, {row['latency_s']:g} s each"
        rows += [
            ("7 in flight", f"{head}: model calls in flight at the peak", str(row["peak_in_flight"]),
             f">= {t['peak_in_flight']}" if n >= t["peak_in_flight"] else "",
             _met(row["peak_in_flight"] >= t["peak_in_flight"]) if n >= t["peak_in_flight"] else ""),
            ("7 in flight", f"  calls/s vs ideal N / latency ({row['ideal_calls_per_s']:g})",
             f"{row['calls_per_s']} ({row['ratio_vs_ideal']:.2f}x)",
             f">= {t['ratio_vs_ideal']}x" if n in t["ratio_vs_ideal_at"] else "",
             _met(row["ratio_vs_ideal"] >= t["ratio_vs_ideal"]) if n in t["ratio_vs_ideal_at"] else ""),
            ("7 in flight", "  CPU per call: workers / PostgreSQL backends",
             f"{row['cpu_ms_per_call']['workers']:.1f} / {row['cpu_ms_per_call']['postgres']:.1f} ms", "", ""),
            ("7 in flight", "  due -> sent p50 / p99",
             f"{row['due_to_sent_p50_s']:.2f} / {row['due_to_sent_p99_s']:.2f} s", "", ""),
            ("7 in flight", "  worker memory (RSS of every worker process): peak / idle",
             f"{row['max_worker_rss_mb']:.0f} / {row['idle_worker_rss_mb']:.0f} MB",
             f"<= {t['worker_rss_mb']} MB" if n == t["worker_rss_mb_at"] else "",
             _met(row["max_worker_rss_mb"] <= t["worker_rss_mb"]) if n == t["worker_rss_mb_at"] else ""),
            ("7 in flight", "  MB an agent in flight holds over idle workers", f"{row['mb_per_agent']:.2f} MB",
             f"<= {t['mb_per_agent']} MB" if n >= t["mb_per_agent_from"] else "",
             _met(row["mb_per_agent"] <= t["mb_per_agent"]) if n >= t["mb_per_agent_from"] else ""),
            ("7 in flight", "  PostgreSQL connections of the bench database", str(row["max_db_connections"]),
             f"<= {r['connection_bound']} (bound)", _met(row["max_db_connections"] <= r["connection_bound"])),
        ]
    k = r["kill_during_model_calls"]
    rows += [
        ("7 in flight", f"SIGKILL of a worker waiting on {k['calls_killed']} model calls ({k['latency_s']:g} s each): "
                        "kill -> next attempt, median / max",
         f"{k['recovery_s_median']:.1f} / {k['recovery_s_max']:.1f} s",
         f"<= {k['target_s']:g} s", _met(k["recovery_s_max"] <= k["target_s"] and not k["not_completed"])),
        ("7 in flight", "  tool calls redone after it", f"{k['tool_calls_redone']} of {k['tool_calls']}", "0",
         _met(k["tool_calls_redone"] == 0)),
    ]
    return rows


def _long_runs(r: dict[str, Any]) -> list[Row]:
    """The long-run targets: per-visit bytes late/early <= 1.5x (autonomous), harness N=200 / N=10
    <= 2x, median advance late/early <= 1.3x, admin page <= 300 KB and < 1 s, show --json < 1 s."""
    rows: list[Row] = []
    for row in r["rows"]:
        run = row["run"]
        growth = row["bytes_per_visit_last"] / max(1.0, row["bytes_per_visit_first"])
        advance = row["advance_median_late_ms"] / max(1e-6, row["advance_median_early_ms"])
        page_kb = row["admin_page_bytes"] / 1024
        rows += [
            ("8 long runs", f"{run}: {row['visits']} node visits, {row['status']}",
             f"{row['bytes_total'] / 2**20:.1f} MB stored, {row['db_growth_bytes'] / 2**20:.1f} MB db growth", "",
             _met(row["status"] == "completed")),
            ("8 long runs", "  stored bytes per visit, last 10 % / first 10 %",
             f"{row['bytes_per_visit_first'] / 1024:.1f} -> {row['bytes_per_visit_last'] / 1024:.1f} KB "
             f"({growth:.2f}x)", "<= 1.5x", _met(growth <= 1.5)),
            ("8 long runs", "  median advance, late / early (p95)",
             f"{row['advance_median_early_ms']:.1f} -> {row['advance_median_late_ms']:.1f} ms ({advance:.2f}x; "
             f"p95 {row['advance_p95_early_ms']:.0f} -> {row['advance_p95_late_ms']:.0f} ms)", "<= 1.3x",
             _met(advance <= 1.3)),
            ("8 long runs", "  admin workflow page",
             f"{page_kb:.0f} KB in {row['admin_page_s']:.2f} s", "<= 300 KB, < 1 s",
             _met(page_kb <= 300 and row["admin_page_s"] < 1)),
            ("8 long runs", "  agent show --json", f"{row['show_json_bytes'] / 1024:.0f} KB in {row['show_s']:.2f} s",
             "< 1 s", _met(row["show_s"] < 1)),
            ("8 long runs", "  export-history / replay-check",
             f"{row['export_bytes'] / 2**20:.1f} MB in {row['export_s']:.1f} s, peak {row['export_peak_mb']:.0f} MB "
             f"/ {row['replay_check_s']:.1f} s", "<= 200 MB peak, replays",
             _met(row["export_peak_mb"] <= 200 and row["replay_check_rc"] == 0 and row["export_rc"] == 0)),
        ]
        if "check_runs_per_pass" in row:  # docs/harness.md, "Regression": about 1 + M + P / K a pass, P <= N
            bound = 1 + 10 + int(run.split()[1]) / 10
            rows.append(("8 long runs", "  check runs per accepted pass (verify and regression)",
                         f"{row['check_runs_per_pass']}", f"<= 1 + M + N / K = {bound:g}",
                         _met(float(row["check_runs_per_pass"]) <= bound)))
    if ratio := r.get("harness_bytes_per_visit_ratio"):
        rows.append(("8 long runs", f"harness bytes per visit, N={ratio['high']} / N={ratio['low']}",
                     f"{ratio['ratio']:.2f}x", "<= 2x", _met(ratio["ratio"] <= 2)))
    return rows


def _ratelimits(r: dict[str, Any]) -> list[Row]:
    """The rate-limit targets, with buckets of 60 s and of 5 s: 429s <= 2 % of requests, successful
    use >= 0.85 x the binding limit; with another client taking 30 %, 429s <= 2 % from 10 s after it
    started; the small tenant's median wait <= 2 x the large one's, priority 9 within 2 x the mean gap."""
    t, lim, fair = r["targets"], r["limit"], r["fairness"]
    by_worker = ", ".join(f"{w} {n}" for w, n in sorted(lim["calls_by_worker"].items()))
    rows: list[Row] = []
    for run in (lim, r.get("limit_5s_buckets")):
        if not run:
            continue
        rows += [
            ("9 rate limits", f"{run['agents']} agents x {run['calls_per_agent']} calls, {run['limit_rpm']} requests "
                              f"and {run['limit_itpm']:,} input tokens a minute in buckets of "
                              f"{run.get('bucket_seconds', 60):g} s: 429s",
             f"{run['rate_limited']} of {run['requests']} ({100 * run['rate_limited_share']:.2f} %)",
             f"<= {100 * t['rate_limited_share']:g} %", _met(run["rate_limited_share"] <= t["rate_limited_share"])),
            ("9 rate limits", f"  once saturated ({run['saturated_window_s']:g} s): requests / input tokens a minute",
             f"{run['ok_requests_per_min']:g} ({run['requests_use']:.2f}x) / {run['input_tokens_per_min']:,} "
             f"({run['input_tokens_use']:.2f}x)", f">= {t['use_of_binding_limit']}x the binding one",
             _met(run["use_of_binding_limit"] >= t["use_of_binding_limit"]))]
    if other := r.get("other_client"):
        rows.append(("9 rate limits", f"  buckets of 5 s, another client taking {100 * other['other_share']:g} %: "
                                      "429s from 10 s after it started",
                     f"{other['rate_limited_after_10_s']} of {other['requests_after_10_s']} "
                     f"({100 * other['rate_limited_share_after_10_s']:.2f} %; "
                     f"{other['use_of_binding_limit']:.2f}x used)",
                     f"<= {100 * t['rate_limited_share_after_10_s']:g} %",
                     _met(other["rate_limited_share_after_10_s"] <= t["rate_limited_share_after_10_s"])))
    return rows + [
        *_without_limiter(r),
        ("9 rate limits", "  attempts by worker process", by_worker, "two share it", _met(len(lim["calls_by_worker"])
                                                                                       >= 2)),
        ("9 rate limits", f"tenants of {fair['large_agents']} and {fair['small_agents']} agents: median wait "
                          "large / small",
         f"{fair['median_wait_s']['large']:.2f} / {fair['median_wait_s']['small']:.2f} s "
         f"({fair['small_over_large_median']:.2f}x)", f"small <= {t['small_over_large_median']:g}x",
         _met(fair["small_over_large_median"] <= t["small_over_large_median"])),
        ("9 rate limits", "  p99 wait large / small", f"{fair['p99_wait_s']['large']:.2f} / "
                          f"{fair['p99_wait_s']['small']:.2f} s", "", ""),
        ("9 rate limits", "priority 9 into the saturated limit: its calls' waits (max / mean gap)",
         ", ".join(f"{w:.2f}" for w in fair["priority9_waits_s"]) + f" s ({fair['priority9_max_over_gap']:.2f}x of "
         f"{fair['mean_gap_s'] * 1000:.0f} ms)", f"<= {t['priority9_max_over_gap']:g}x",
         _met(fair["priority9_max_over_gap"] <= t["priority9_max_over_gap"])),
    ]


def _without_limiter(r: dict[str, Any]) -> list[Row]:
    w, lim = r.get("without_limiter"), r["limit"]
    if not w:
        return []
    return [("9 rate limits", "  baseline without the shared limiter: 429s; use once saturated; run time",
             f"{w['rate_limited']} of {w['requests']} ({100 * w['rate_limited_share']:.1f} %); "
             f"{w['use_of_binding_limit']:.2f}x; {w['seconds']:g} s (with it {lim['seconds']:g} s)", "", "")]


def _slots(r: dict[str, Any]) -> list[Row]:
    """The concurrency-key targets: at equal demand no tenant's p99 wait over 2x another's; the
    small tenant's median wait <= 2x the large one's; the cap held and used."""
    t, eq, un = r["targets"], r["equal"], r["unequal"]
    p99 = " / ".join(f"{v:.2f}" for v in eq["p99_wait_s"].values())
    rows: list[Row] = [
        ("10 concurrency keys", f"two tenants of {eq['workflows']['large']} workflows x {eq['steps']} activities of "
                                f"1 s, cap {eq['cap']}: p99 wait", f"{p99} s ({r['p99_ratio_equal']:.2f}x)",
         f"<= {t['p99_ratio_equal']:g}x", _met(r["p99_ratio_equal"] <= t["p99_ratio_equal"])),
        ("10 concurrency keys", "  most running at once; the cap's use", f"{eq['most_at_once']} of {eq['cap']}; "
         f"{eq['cap_use']:.2f}x", f"<= cap; >= {t['cap_use']:g}x", _met(eq["most_at_once"] <= eq["cap"]
                                                                         and eq["cap_use"] >= t["cap_use"])),
        ("10 concurrency keys", f"tenants of {un['workflows']['large']} and {un['workflows']['small']} workflows: "
                                "median wait large / small",
         f"{un['median_wait_s']['large']:.2f} / {un['median_wait_s']['small']:.2f} s "
         f"({r['small_over_large_median']:.2f}x)", f"small <= {t['small_over_large_median']:g}x",
         _met(r["small_over_large_median"] <= t["small_over_large_median"])),
    ]
    rows += [("10 concurrency keys", f"  the pass handing on a freed slot, {p['waiting']:,} waiting",
              f"{p['median_ms']:.2f} ms (max {p['max_ms']:.2f})", "", "") for p in r["pass"]]
    return rows


SECTIONS = {"throughput": _throughput, "inflight": _inflight, "ablations": _ablations, "growth": _growth,
            "long_runs": _long_runs, "ratelimits": _ratelimits, "slots": _slots, "parked": _parked, "timers": _timers,
            "recovery": _recovery, "profile": _profile}


def table(results: dict[str, Any]) -> str:
    rows: list[Row] = []
    for name, result in results["benchmarks"].items():
        if "error" in result:
            rows.append((name, "FAILED", result["error"][:80], "", ""))
        elif "skipped" in result:
            rows.append((name, "skipped", result["skipped"][:80], "", ""))
        else:
            try:
                rows += SECTIONS[name](result)
            except (KeyError, ZeroDivisionError, TypeError, ValueError) as exc:
                rows.append((name, "incomplete", f"{type(exc).__name__}: {exc}"[:80], "", ""))
        if result.get("disturbed_by"):
            rows.append((name, "WARNING: disturbed", result["disturbed_by"][0][:80], "", ""))
    header: Row = ("benchmark", "figure", "value", "target", "")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    quick = " (--quick: sizes too small for the figures to mean much)" if results["quick"] else ""
    title = f"agentops benchmarks {results['date']}{quick}"
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)
