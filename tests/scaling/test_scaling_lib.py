#!/usr/bin/env python3
"""Unit tests of the pure functions of bench/scaling: reading records and judging the machine's
load, the alpha-beta model and its fit, the compute estimates, reading `tpdraft info --json`
answers, the long-context projection's split of the kv heads, the tables and the plot data. Runs
in a second; with TPDRAFT_BIN set, a few tiny `tpdraft info` calls check the Info wrapper and the
long-context projection against the program too."""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.join(REPO, "bench", "scaling"))
import commmodel as cm  # noqa: E402
import compute  # noqa: E402
import geometry  # noqa: E402
import plots  # noqa: E402
import project  # noqa: E402
import records  # noqa: E402
import report  # noqa: E402
import tables as tb  # noqa: E402
import timing  # noqa: E402  (bench/timing.py, on the path through records)
import vocab  # noqa: E402


def bench_json(**over):
    """A `tpdraft bench --json` object with the keys the scripts read."""
    d = {"config": "configs/x.json", "backend": "cpu", "threads": 1, "tp": 2, "communicator": "mpi",
         "gather_logits": False, "sessions": 2, "context": 256, "dtype": "BF16", "draft_ms": 10.0,
         "draft_ms_p10": 9.8, "draft_ms_p90": 10.3, "compute_ms": 9.5, "comm_ms": 0.6, "comm_ms_median": 0.5,
         "layers_ms": 6.0, "head_ms": 3.0, "select_ms": 0.1, "all_reduce_calls": 4.0, "all_reduce_bytes": 4096.0,
         "all_gather_calls": 1.0, "all_gather_bytes": 480.0, "broadcast_calls": 2.0, "broadcast_bytes": 360.0,
         "weights_bytes_per_rank": 1e6, "context_bytes_per_rank": 2e5, "draft_gflop": 1.5, "draft_gbytes": 0.5,
         "machine_read_gbps": 10.0, "machine_gemm_gflops": 100.0, "tokens": list(range(15))}
    d.update(over)
    return d


def run(**over):
    return records.run_from_json(bench_json(**over))


class Records(unittest.TestCase):
    def test_bench_keys_become_fields(self):
        r = run()
        self.assertEqual((r.config_name, r.tp, r.sessions, r.context), ("x", 2, 2, 256))
        self.assertEqual(r.comm_ms, 0.5)  # the median per draft wins over the mean
        self.assertEqual(r.collectives["all_gather"], (1.0, 480.0))
        self.assertEqual(r.draft_tokens, 15)
        self.assertAlmostEqual(r.spread, 0.05)

    def test_older_records_fall_back(self):
        d = bench_json()
        for k in ("compute_ms", "comm_ms_median", "draft_ms_p10"):
            del d[k]
        r = records.run_from_json(d)
        self.assertAlmostEqual(r.compute_ms, 9.4)  # draft minus the mean comm
        self.assertEqual(r.comm_ms, 0.6)
        self.assertIsNone(r.spread)

    def test_annotate_adds_the_run_and_the_machine(self):
        rec = records.annotate(bench_json(tp=4, threads=1), "configs/x.json", 2, "cpu", "host", {"study": "weak"},
                               {"other_cores": 0.1})
        self.assertTrue(rec["oversubscribed"])  # 4 ranks on 2 cores
        self.assertEqual((rec["config_name"], rec["study"], rec["load"]), ("x", "weak", {"other_cores": 0.1}))
        self.assertEqual(records.run_from_json(rec).study, "weak")

    def test_shared_reasons(self):
        self.assertEqual(records.shared_reasons(run(load={"other_cores": 0.1, "steal_share": 0.0})), [])
        busy = records.shared_reasons(run(draft_ms_p90=12.0, load={"other_cores": 1.5, "steal_share": 0.05}))
        self.assertEqual(len(busy), 3)
        self.assertIn("other processes kept 1.50 cores busy", busy)
        self.assertEqual(records.shared_reasons(run(note="2 hosts, one machine")), ["2 hosts, one machine"])

    def test_ranks_spread_over_hosts_are_oversubscribed_by_their_busiest_host(self):
        for hosts, over in ((1, True), (2, False), (3, False)):  # 4 ranks: 4, 2 and 2 on the busiest of 2 cores
            rec = records.annotate(bench_json(tp=4, threads=1), "configs/x.json", 2, "cpu", "host", {"hosts": hosts})
            self.assertEqual(rec["oversubscribed"], over, hosts)
            self.assertEqual(records.run_from_json(rec).hosts, hosts)

    def test_dedupe_keeps_the_median_run(self):
        runs = [run(draft_ms=t) for t in (12.0, 10.0, 11.0)] + [run(tp=1, draft_ms=20.0)]
        kept = sorted(records.dedupe(runs), key=lambda r: r.tp)
        self.assertEqual([(r.tp, r.draft_ms) for r in kept], [(1, 20.0), (2, 11.0)])

    def test_roofline_ratio_from_the_record_or_from_its_ceilings(self):
        r = run(roofline_ms=8.0, roofline_ratio=1.25)
        self.assertEqual((r.roofline_ms, r.roofline_ratio), (8.0, 1.25))
        # An older record: 1.5 GFLOP at 100 GFLOP/s is 15 ms, 0.5 GB at 10 GB/s is 50 ms; the draft took 10.
        r = run()
        self.assertAlmostEqual(r.roofline_ms, 50.0)
        self.assertAlmostEqual(r.roofline_ratio, 0.2)
        self.assertIsNone(run(machine_read_gbps=0.0).roofline_ratio)  # no ceilings, no roofline

    def test_measured_collectives_per_call(self):
        self.assertEqual(records.measured_collectives(run()),
                         [("all_reduce", 4.0, 1024.0), ("all_gather", 1.0, 480.0), ("broadcast", 2.0, 180.0)])
        self.assertEqual(records.measured_collectives(run(tp=1)), [])


class MachineLoad(unittest.TestCase):
    def test_stat_line(self):
        busy, steal, total = timing.parse_stat_line("cpu  100 5 20 800 10 3 2 7 0 0")
        self.assertEqual((busy, steal, total), (130, 7, 947))

    def test_load_between_separates_our_time_from_others(self):
        before = {"t": 0.0, "busy": 0, "steal": 0, "total": 0, "loadavg": [0.5, 0, 0]}
        after = {"t": 2.0, "busy": 500, "steal": 20, "total": 1000, "loadavg": [1.5, 0, 0]}
        load = timing.load_between(before, after, 3.0, 100)  # 5 s busy, 3 s ours
        self.assertEqual(load["other_cpu_s"], 2.0)
        self.assertEqual(load["other_cores"], 1.0)
        self.assertEqual(load["steal_share"], 0.02)

    def test_the_harness_judges_the_load_and_shapes_a_figure(self):
        import timing  # bench/timing.py, which records.py puts on the path
        self.assertEqual(timing.load_reasons({"other_cores": 0.25, "steal_share": 0.02}), [])
        self.assertEqual(timing.load_reasons({"other_cores": 1.0, "steal_share": 0.05}),
                         ["other processes kept 1.00 cores busy", "5% of the CPU time stolen"])
        load = {"other_cores": 1.0, "steal_share": 0.0, "loadavg_after": [1.5, 0, 0]}
        self.assertTrue(timing.describe(load).startswith("NOT idle: other processes kept 1.00 cores busy"))
        self.assertFalse(timing.machine_load(load)["idle"])
        f = timing.figure("draft_ms", [0.004, 0.001, 0.003, 0.002, 0.005], 1e3)
        self.assertEqual(sorted(f), ["draft_ms_max", "draft_ms_median", "draft_ms_min", "draft_ms_p10",
                                     "draft_ms_p90", "draft_ms_runs"])
        self.assertEqual((f["draft_ms_median"], f["draft_ms_min"], f["draft_ms_max"], f["draft_ms_runs"]),
                         (3.0, 1.0, 5.0, 5))
        self.assertEqual(len(timing.time_runs(lambda i: None, 2, 3)), 3)


class CommModel(unittest.TestCase):
    def test_one_node_formulas(self):
        f = cm.Fabric("f", 10e-6, 1e9)
        for op, link_s in (("all_reduce", 1.5e-3), ("all_gather", 3e-3), ("broadcast", 1e-3)):
            self.assertAlmostEqual(cm.collective_time(op, 1e6, 4, f), 10e-6 + link_s, msg=op)
        self.assertEqual(cm.collective_time("all_reduce", 1e6, 1, f), 0.0)

    def test_hierarchical_all_reduce(self):
        intra, inter = cm.Fabric("i", 5e-6, 100e9), cm.Fabric("x", 30e-6, 10e9)
        # 2 nodes x 8: reduce-scatter + all-gather inside (2 alphas, 2*7/8 n), 1/8 of n across.
        want = 2 * 5e-6 + 2 * 7 / 8 * 8e6 / 100e9 + 30e-6 + 2 * 1 / 2 * 1e6 / 10e9
        self.assertAlmostEqual(cm.collective_time("all_reduce", 8e6, 16, intra, inter, 2), want)

    def test_fit_recovers_alpha_and_beta(self):
        fab = cm.Fabric("synthetic", 30e-6, 4e9)
        pts = []
        for b in (1, 2, 4, 8):
            colls = [("all_reduce", 4, 4096 * b), ("all_gather", 1, 960 * b), ("broadcast", 2, 90 * b)]
            calls, moved = cm.comm_features(colls, 2)
            pts.append((calls, moved, cm.comm_time(colls, 2, fab)))
        a, bw, resid = cm.fit_alpha_beta(pts)
        self.assertAlmostEqual(a / 30e-6, 1.0, places=6)
        self.assertAlmostEqual(bw / 4e9, 1.0, places=6)
        self.assertLess(resid, 1e-9)

    def test_fit_with_one_message_size_keeps_one_term(self):
        a, bw, _ = cm.fit_alpha_beta([(7, 1000, 7e-5), (7, 1000, 7e-5)])
        self.assertTrue(a == 0.0 or bw == float("inf"))

    def test_parameter_ranges(self):
        p = {"alpha_us": 20, "alpha_us_range": [15, 24], "bw_GBps": 370, "bw_GBps_range": [370, 400]}
        fast, slow = cm.fabric_from_params("n", p, "low"), cm.fabric_from_params("n", p, "high")
        self.assertEqual((round(fast.alpha["all_reduce"] * 1e6, 9), fast.bw), (15, 400e9))
        self.assertEqual((round(slow.alpha["broadcast"] * 1e6, 9), slow.bw), (24, 370e9))

    def test_cpu_fabric_without_mpi_runs_takes_the_defaults(self):
        f = cm.cpu_fabric([run(tp=1, communicator="single")], {"fabrics": {"cpu_mpi": {"alpha_us": 10, "bw_GBps": 5}}})
        self.assertEqual((round(f.alpha["all_reduce"] * 1e6, 9), f.bw, f.label), (10, 5e9, "CPU MPI (default)"))


def answer(tp, sessions=2, flops=1e9, weight_bytes=4e8, context_bytes=1e8, dflash2=True):
    """A `tpdraft info --json` answer with the fields geometry.py reads."""
    coll = {"greedy": {"all_reduce": {"calls": 4, "bytes": 4 * 8192}, "all_gather": {"calls": 1, "bytes": 1920},
                       "broadcast": {"calls": 2, "bytes": 360}},
            "greedy_gather_logits": {"all_gather": {"calls": 2, "bytes": 1920 + 30 * 500 * 4}}}
    rank = {"bytes": {"head": 5e6, "total": 9e6, "context_per_position": 1024},
            "draft": {"flops": flops / tp, "weight_bytes": weight_bytes / tp, "context_bytes": context_bytes / tp},
            "collectives": coll}
    return {"tp": tp, "sessions": sessions, "context": 256, "dflash2": dflash2, "vocab_padded": 1000,
            "geometry": {"block": 16, "selector_top_k": 4}, "ranks": [rank] * tp}


def small_answer(tp, context):
    """The answer `tpdraft info --json` gives for bench/scaling/small-dflash2-512.json (8 q heads,
    4 kv heads, head_dim 64, a sliding layer of window 512 and a full one, block 16), one session:
    only the fields geometry.attention reads, each rank's heads as the shard plan splits them."""
    def heads(n, r):
        per = n // tp if n >= tp else 1
        first = r * per if n >= tp else r * n // tp
        return [first, first + per]
    ranks = [{"plan": {"q_heads": heads(8, r), "kv_heads": heads(4, r)}} for r in range(tp)]
    return {"tp": tp, "sessions": 1, "context": context, "ranks": ranks,
            "geometry": {"layers": 2, "q_heads": 8, "kv_heads": 4, "head_dim": 64, "block": 16, "window": 512,
                         "sliding": [True, False]}}


# Per rank at context 4096 by hand: the sliding layer sees 512 keys, the full one 4096, 4608 in
# all. K/V bytes, f32: 4608 keys x 2 (K, V) x 64 x 4 bytes = 2359296 per kv head, times the rank's kv
# heads: 4, 2, 1 at tp 1, 2, 4 and still 1 at tp 8 (two ranks share each). FLOPs: 2 x 2 x 16 rows x
# 64 x ((512 + 16) + (4096 + 16)) = 19005440 per q head, times the rank's q heads 8 / tp.
HAND_KV_BYTES = {1: 4 * 2359296, 2: 2 * 2359296, 4: 2359296, 8: 2359296}
HAND_ATTENTION_FLOPS = {tp: 8 // tp * 19005440 for tp in (1, 2, 4, 8)}


class LongContexts(unittest.TestCase):
    def test_each_rank_holds_its_share_of_the_kv_heads(self):
        for tp in (1, 2, 4, 8):
            a = geometry.attention(small_answer(tp, 4096))
            self.assertEqual((a.kv_heads, a.q_heads), ({1: 4, 2: 2, 4: 1, 8: 1}[tp], 8 // tp), tp)
            self.assertEqual(a.kv_bytes, HAND_KV_BYTES[tp], tp)
            self.assertEqual(a.flops, HAND_ATTENTION_FLOPS[tp], tp)
            self.assertEqual(geometry.attention(small_answer(tp, 4096), 2).kv_bytes, HAND_KV_BYTES[tp] // 2)
        # Past the window only the full layer grows: 131072 + 512 keys.
        self.assertEqual(geometry.attention(small_answer(2, 131072)).kv_bytes, (131072 + 512) * 2 * 2 * 64 * 4)

    @unittest.skipUnless(os.environ.get("TPDRAFT_BIN"), "TPDRAFT_BIN not set")
    def test_projection_per_rank_against_the_hand_count_and_the_program(self):
        gpu = compute.Machine("G", 989e12, 4300e9)
        fabric = {"value": cm.Fabric("nv", 20e-6, 370e9, "test")}
        s = project.Setting({}, [], geometry.Info(os.environ["TPDRAFT_BIN"]), gpu, fabric, fabric, {}, False, "bf16")
        config = os.path.join(REPO, "bench", "scaling", "small-dflash2-512.json")
        rows = project.long_context_points(s, config, 1, [4096], [1, 2, 4, 8])
        self.assertEqual([r["tp"] for r in rows], [1, 2, 4, 8])
        for r in rows:
            tp = r["tp"]
            self.assertEqual(r["kv_bytes"], {"f32": HAND_KV_BYTES[tp], "bf16": HAND_KV_BYTES[tp] // 2}, tp)
            self.assertEqual(r["attention_flops"], HAND_ATTENTION_FLOPS[tp], tp)
            # The program counts the same context bytes (its cache is f32) and the attention inside its FLOPs.
            answer = s.info.query(config, tp, 1, 4096)
            self.assertEqual(geometry.work(answer).context_bytes, HAND_KV_BYTES[tp], tp)
            self.assertGreater(r["flops"], r["attention_flops"])
            want = max(r["flops"] / 989e12, (r["weight_bytes"] + HAND_KV_BYTES[tp]) / 4300e9) * 1e3
            self.assertAlmostEqual(r["floor_ms"]["f32"], want, tp)
            self.assertEqual(r["comm_ms"] == 0, tp == 1)
            self.assertAlmostEqual(r["total_ms"]["bf16"], r["floor_ms"]["bf16"] + r["comm_ms"])
        table = project.long_context_table(rows).splitlines()
        self.assertTrue(table[2].startswith("| 4096 | 1 | 4 | 0.009 → 0.005 | 0.15 | "), table[2])
        self.assertTrue(table[5].startswith("| 4096 | 8 | 1 | 0.002 → 0.001 | 0.02 | "), table[5])


class FakeInfo:
    """Answers at any tp from answer(); tp = 3 cannot shard, and tp = 8 cuts the groups of quantized weights."""

    def query(self, config, tp, sessions=1, context=1024, dtype="bf16", quant="", draft_vocab=0):
        if tp == 3 or (quant and tp == 8):
            raise geometry.NotShardable(f"tp = {tp}")
        a = answer(tp, sessions)
        if quant:  # quantized weights: a quarter of the bytes, as int4 would hold them
            for rank in a["ranks"]:
                rank["draft"] = dict(rank["draft"], weight_bytes=rank["draft"]["weight_bytes"] / 4)
        if draft_vocab:  # a draft vocabulary: half the weight bytes and FLOPs are the head's, cut to a tenth
            a["ranks"] = [dict(rank) for rank in a["ranks"]]  # answer() repeats one rank object
            for rank in a["ranks"]:
                d = rank["draft"]
                rank["draft"] = dict(d, weight_bytes=d["weight_bytes"] * 0.55, flops=d["flops"] * 0.55)
        return a

    def problem(self, config, tp):
        return "tp = 3" if tp == 3 else None


class Geometry(unittest.TestCase):
    def test_reading_an_answer(self):
        a = answer(2)
        self.assertEqual(geometry.draft_rows(a), 30)
        self.assertEqual(geometry.candidates(a), 4)
        self.assertEqual(geometry.candidates(answer(2, dflash2=False)), 1)
        self.assertEqual(geometry.collectives(a),
                         [("all_gather", 1, 1920.0), ("all_reduce", 4, 8192.0), ("broadcast", 2, 180.0)])
        self.assertEqual(geometry.full_logits_block(a), 30 * 500 * 4)
        self.assertEqual(geometry.candidates_block(a), 1920)

    def test_error_text_and_dtypes(self):
        err = "[05:52:53.363] [rank 0/1] [error] num_attention_heads (32) is not divisible by tp = 3\n"
        self.assertEqual(geometry.error_text(err), "num_attention_heads (32) is not divisible by tp = 3")
        self.assertEqual([geometry.info_dtype(x) for x in ("BF16", "F32", 2, "f16")], ["bf16", "f32", "bf16", "f16"])

    def test_vocab_configs_keep_the_mask_inside(self):
        with tempfile.TemporaryDirectory() as work:
            base = os.path.join(work, "base.json")
            with open(base, "w") as f:
                json.dump({"vocab_size": 1000, "dflash_config": {"mask_token_id": 900}}, f)
            written = dict(geometry.write_vocab_configs(base, [500, 2000], os.path.join(work, "out")))
            small, large = (tb.read_json(written[v]) for v in (500, 2000))
            self.assertEqual((small["vocab_size"], small["dflash_config"]["mask_token_id"]), (500, 499))
            self.assertEqual(large["dflash_config"]["mask_token_id"], 900)
            self.assertTrue(written[500].endswith("base-v500.json"))

    @unittest.skipUnless(os.environ.get("TPDRAFT_BIN"), "TPDRAFT_BIN not set")
    def test_info_asks_the_program(self):
        info = geometry.Info(os.environ["TPDRAFT_BIN"])
        config = os.path.join(REPO, "configs", "tiny-dflash.json")
        a = info.query(config, 2, 1, 16)
        self.assertEqual(geometry.collectives(a)[1], ("all_reduce", 4, 8 * 64 * 4))  # 2 L calls of [B, H] f32
        self.assertIn("is not divisible by tp = 3", info.problem(config, 3))


class Compute(unittest.TestCase):
    def test_roofline_takes_the_slower_ceiling(self):
        m = compute.Machine("m", 1e12, 1e11)
        self.assertEqual(compute.roofline_s(geometry.Work(1e9, 4e8, 1e8), m), 5e-3)  # memory-bound
        self.assertEqual(compute.roofline_s(geometry.Work(1e10, 4e8, 1e8), m), 1e-2)  # compute-bound

    def test_measured_then_affine_then_roofline_ratio(self):
        info = FakeInfo()
        runs = [run(tp=1, sessions=1, compute_ms=10.0), run(tp=1, sessions=4, compute_ms=16.0),
                run(tp=2, sessions=4, compute_ms=9.0)]
        self.assertEqual(compute.estimate_compute(runs, info, "x.json", 1, 4, 256)[0], 16.0)
        ms, how = compute.estimate_compute(runs, info, "x.json", 1, 2, 256)
        self.assertAlmostEqual(ms, 12.0)
        self.assertTrue(how.startswith("affine"))
        # tp = 4 from tp = 2: the fake work halves with tp, at the run's own ceilings.
        ms, how = compute.estimate_compute(runs, info, "x.json", 4, 4, 256)
        self.assertAlmostEqual(ms, 4.5)
        self.assertIn("roofline ratio 0.5", how)

    def test_runs_on_a_busy_machine_serve_only_when_nothing_else_fits(self):
        idle, busy = run(tp=1, compute_ms=10.0), run(tp=2, compute_ms=9.0, load={"other_cores": 1.0})
        self.assertEqual(compute.compute_candidates([idle, busy], "x", 256), [idle])
        ms, how = compute.estimate_compute([busy], FakeInfo(), "x.json", 2, 2, 256)
        self.assertEqual((ms, how), (9.0, "measured at tp=2, b=2 (machine not idle)"))
        # The one idle run (tp = 1, b = 1) gives no estimate at tp = 2, b = 2: the busy runs do.
        shared = {"other_cores": 1.0}
        runs = [run(tp=1, sessions=1), run(tp=2, sessions=1, compute_ms=6.0, load=shared),
                run(tp=2, sessions=4, compute_ms=9.0, load=shared)]
        ms, how = compute.estimate_compute(runs, FakeInfo(), "x.json", 2, 2, 256)
        self.assertAlmostEqual(ms, 7.0)
        self.assertEqual(how, "affine in sessions from b=1,4 at tp=2 (machine not idle)")

    def test_gpu_estimate_caps_the_efficiency(self):
        gpu = compute.Machine("G", 1e15, 1e12)
        ideal = compute.roofline_s(geometry.work(answer(2, sessions=2)), gpu) * 1e3
        # The run's own roofline: 2.5e8 bytes at 10 GB/s = 25 ms, measured faster (9.5 ms): capped at 100 %.
        ms, how, kind = compute.estimate_compute_on(gpu, [run()], FakeInfo(), "x.json", 2, 2, 256)
        self.assertEqual((ms, kind), (ideal, "roofline"))
        self.assertIn("(capped)", how)
        self.assertEqual(compute.estimate_compute_on(gpu, [], FakeInfo(), "x.json", 2, 2, 256)[2], "ideal")


class QuantizedProjection(unittest.TestCase):
    def test_quantized_weights_change_only_the_compute(self):
        gpu = compute.Machine("G", 1e15, 1e12)  # bound by bytes: a quarter of the weights' bytes
        s = project.Setting({}, [], FakeInfo(), gpu, None, None, {}, False, "bf16")
        rows = [{"layout": "1x2", "tp": 2, "total_ms": 1.0, "comm_ms": 0.1}, {"layout": "1x3", "tp": 3, "skipped": "tp = 3"}]
        points = project.project_quant(s, "x.json", 256, 2, rows, ["q4"])
        self.assertEqual([p["layout"] for p in points], ["1x2"])  # a layout that cannot shard is left out
        full = compute.roofline_s(geometry.work(answer(2, 2)), gpu) * 1e3
        quant = compute.roofline_s(geometry.work(FakeInfo().query("x.json", 2, 2, quant="q4")), gpu) * 1e3
        self.assertLess(quant, full)
        self.assertAlmostEqual(points[0]["total_ms"]["q4"], quant + 0.1)
        self.assertEqual(points[0]["total_ms"]["bf16"], 1.0)
        self.assertIn("| 1x2 | 2 | 1 | ", project.variants_table(points, {"bf16": "float weights ms", "q4": "q4 ms"}))

    def test_a_preset_whose_groups_a_tp_cuts_is_marked_not_projected(self):
        s = project.Setting({}, [], FakeInfo(), compute.Machine("G", 1e15, 1e12), None, None, {}, False, "bf16")
        rows = [{"layout": "1x8", "tp": 8, "total_ms": 1.0, "comm_ms": 0.1}]
        points = project.project_quant(s, "x.json", 256, 2, rows, ["q4"])
        self.assertEqual(points[0]["total_ms"], {"bf16": 1.0, "q4": None})
        self.assertIn("| 1x8 | 8 | 1 | – (tp cuts its groups) |",
                      project.variants_table(points, {"bf16": "float weights ms", "q4": "q4 ms"}))


class DraftVocabularyProjection(unittest.TestCase):
    def test_a_draft_vocabulary_changes_the_compute_at_the_full_runs_efficiency(self):
        gpu = compute.Machine("G", 1e15, 1e12)  # bound by bytes
        fabric = {"value": cm.Fabric("nv", {"all_reduce": 0.0, "all_gather": 0.0, "broadcast": 0.0}, 1e30, "test")}
        s = project.Setting({}, [], FakeInfo(), gpu, fabric, fabric, {}, False, "bf16")
        rows = [{"layout": "1x2", "tp": 2, "tp_nodes": 1, "total_ms": 1.0, "comm_ms": 0.1},
                {"layout": "1x3", "tp": 3, "skipped": "tp = 3"}]
        points = project.project_draft_vocab(s, "x.json", 256, 2, rows, [32000])
        self.assertEqual([p["layout"] for p in points], ["1x2"])
        full = compute.roofline_s(geometry.work(answer(2, 2)), gpu) * 1e3
        mapped = compute.roofline_s(geometry.work(FakeInfo().query("x.json", 2, 2, draft_vocab=32000)), gpu) * 1e3
        # Weight bytes 0.55x, context bytes unchanged: (0.55 * 2e8 + 5e7) / (2e8 + 5e7) of the full roofline.
        self.assertAlmostEqual(mapped / full, (0.55 * 2e8 + 5e7) / 2.5e8)
        self.assertAlmostEqual(points[0]["total_ms"]["32000"], mapped)  # no comm on this fabric
        self.assertEqual(points[0]["total_ms"]["full"], 1.0)
        self.assertIn("| 1x2 | 2 | 1 | ",
                      project.variants_table(points, {"full": "full head ms", "32000": "draft vocabulary 32000 ms"}))


class VocabularyStudy(unittest.TestCase):
    def test_bytes_table_at_one_rank_has_no_ratio_to_candidates(self):
        one = answer(1)
        for rank in one["ranks"]:
            rank["collectives"]["greedy"]["all_gather"] = {"calls": 0, "bytes": 0}
        rows = vocab.bytes_rows({(1000, 1): one, (1000, 2): answer(2)})
        self.assertEqual([r["candidates_total"] for r in rows], [0, 2 * 1920])
        table = vocab.bytes_table(rows).splitlines()
        self.assertTrue(table[2].endswith(" | – |"), table[2])
        self.assertTrue(table[3].endswith(f" | {rows[1]['full_total'] / (2 * 1920):.0f}x |"), table[3])


class Reports(unittest.TestCase):
    def test_tables_and_formats(self):
        self.assertEqual(tb.md_table(["a", "b"], [[1, 2]]), "| a | b |\n|---|---|\n| 1 | 2 |")
        self.assertEqual((tb.fmt_ms(0.01234), tb.fmt_ms(12345.6), tb.fmt_ms(None)), ("0.0123", "12346", "–"))
        self.assertEqual((tb.fmt_bytes(512), tb.fmt_bytes(3 * 2 ** 20)), ("512 B", "3 MiB"))
        legend = tb.Legend("G")
        self.assertEqual([legend.tag("x"), legend.tag("y"), legend.tag("x")], ["G1", "G2", "G1"])

    def test_strong_rows_and_plot_points(self):
        rows = report.strong_rows([run(tp=1, draft_ms=10.0, draft_ms_p10=9.0, draft_ms_p90=11.0),
                                   run(tp=2, draft_ms=6.0, draft_ms_p10=5.0, draft_ms_p90=7.5)])
        self.assertAlmostEqual(rows[1]["speedup"], 10 / 6)
        self.assertAlmostEqual(rows[1]["efficiency"], 10 / 12)
        self.assertEqual(rows[1]["shared"], ["p10–p90 spread 42% of the median"])
        pts = plots.measured_points(rows)
        tp, ms, lo, hi, eff, eff_lo, eff_hi, comm, ideal, shared = pts[1]
        self.assertEqual((tp, ms, lo, hi, ideal, shared), (2, 6.0, 5.0, 7.5, 5.0, 1))
        self.assertAlmostEqual(eff, 100 * 10 / 12)
        self.assertAlmostEqual(eff_lo, 100 * 10 / 15)  # the slow end of the spread
        self.assertAlmostEqual(comm, 100 * 0.5 / 6)

    def test_every_table_has_the_roofline_ratio(self):
        strong = report.strong_rows([run(tp=1, draft_ms=10.0, roofline_ms=8.0, roofline_ratio=1.25),
                                     run(tp=2, draft_ms=6.0)])  # an older record: 6 ms / 50 ms
        self.assertEqual([r["roofline_ratio"] for r in strong], [1.25, 0.12])
        lines = report.strong_table(strong).splitlines()
        self.assertTrue(lines[0].endswith("| context/rank | roofline ratio |"), lines[0])
        self.assertTrue(lines[2].endswith("| 1.25 |") and lines[3].endswith("| 0.12 |"), lines[2:])
        weak = report.weak_table(report.weak_rows([run(tp=1, sessions=1, roofline_ratio=1.5),
                                                   run(tp=2, sessions=2, roofline_ratio=1.75)])).splitlines()
        self.assertTrue(weak[2].endswith("| 1.50 |") and weak[3].endswith("| 1.75 |"), weak)

    def test_context_sweep_rows_by_context(self):
        runs = [run(tp=1, context=32768, draft_ms=193.9, roofline_ms=157.5, roofline_ratio=193.9 / 157.5,
                    context_bytes_per_rank=168e6),
                run(tp=1, context=1024, draft_ms=20.0, roofline_ms=16.0, roofline_ratio=1.25),
                run(tp=2, context=1024)]  # a single context at tp = 2: no sweep
        series = report.context_series(runs)
        self.assertEqual(list(series), [("x", "cpu", 1, 2, 1)])
        rows = report.context_rows(series[("x", "cpu", 1, 2, 1)])
        self.assertEqual([r["context"] for r in rows], [1024, 32768])
        table = report.context_table(rows).splitlines()
        self.assertEqual(table[2], "| 1024 | 20 | 6 | 3 | 0.5 | 195 KiB | 16 | 1.25 |")
        self.assertEqual(table[3], "| 32768 | 194 | 6 | 3 | 0.5 | 160 MiB | 158 | 1.23 |")
        md = "\n".join(report.sections({}, {}, {report.context_title(k): rows for k in series}))
        self.assertIn("## Context sweep", md)
        self.assertIn("### x cpu tp=1 b=2 thr=1", md)

    def test_projected_series_keeps_one_group_per_tp(self):
        pts = [{"config": "c", "context": 1, "sessions": 1, "tp": t, "replicas": r, "total_ms": 1.0 / t + 0.1,
                "total_ms_range": [0.9 / t, 1.1 / t + 0.2], "comm_share": 0.1}
               for t, r in ((1, 1), (2, 1), (8, 1), (8, 2))] + [{"tp": 3, "skipped": "no"}]
        series = plots.projected_series({"gpu_points": pts})
        self.assertEqual(sorted(p["tp"] for p in series["c ctx=1 b=1"]), [1, 2, 8])
        points = plots.projected_points(series["c ctx=1 b=1"])
        self.assertAlmostEqual(points[0][plots.EFF - 1], 100.0)
        self.assertAlmostEqual(points[-1][plots.EFF - 1], 100 * 1.1 / (8 * 0.225))


if __name__ == "__main__":
    unittest.main()
