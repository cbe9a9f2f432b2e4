"""`tpdraft bench` against its record of this machine's ceilings: the first run writes the record,
a record far above what the machine does marks the run "ceilings_low" with the reason, and a
record the run beats is raised to the new best; a quantized drafter's roofline takes its int8 and
int4 FLOPs at the quantized matmuls' own rates (recomputed here from the JSON). Usage: test_bench_ceilings.py TPDRAFT_BIN"""
import json
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "tiny-dflash2.json")


def bench(record, *extra):
    env = dict(os.environ, TPDRAFT_CEILINGS_FILE=record)
    out = subprocess.run([BIN, "bench", "--config", CONFIG, "--ctx", "64", "--repeat", "2", "--warmup", "0",
                          "--threads", "1", "--json", *extra], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1, out.stdout
    return rows[0], out.stderr


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "ceilings.json")
        first, _ = bench(record)
        c = first["ceilings"]
        # The ceilings used are the larger of the two measurements.
        check(first["machine_gemm_gflops"] == max(c["gemm_gflops_before"], c["gemm_gflops_after"]), "gemm not the max")
        check(first["machine_read_gbps"] == max(c["read_gbps_before"], c["read_gbps_after"]), "read not the max")
        saved = json.load(open(record))
        check(saved.get(c["record_key"], {}).get("gemm_gflops") == first["machine_gemm_gflops"],
              f"first run did not record its GEMM ceiling: {saved}")
        # A record 100x above this machine: the run's ceilings are low, said in the JSON and on stderr,
        # and the record keeps the higher value.
        json.dump({c["record_key"]: {"gemm_gflops": 1e6, "read_gbps": 1e5}}, open(record, "w"))
        low, err = bench(record)
        check(low["ceilings_low"] is True, "a record 100x higher did not mark the ceilings low")
        check(any("GEMM" in why and "recorded" in why for why in low["ceilings_low_because"]),
              f"no GEMM reason: {low['ceilings_low_because']}")
        check("ceilings are low" in err, "no warning printed")
        check(json.load(open(record))[c["record_key"]]["gemm_gflops"] == 1e6, "a lower run lowered the record")
        # A record far below: raised to this run's ceilings, not low on that account.
        json.dump({c["record_key"]: {"gemm_gflops": 1e-3, "read_gbps": 1e-3}}, open(record, "w"))
        high, _ = bench(record)
        check(not any("recorded" in why for why in high["ceilings_low_because"]), "a beaten record marked it low")
        check(json.load(open(record))[c["record_key"]]["gemm_gflops"] == high["machine_gemm_gflops"],
              "the record was not raised")
        # No record at all ("none"): judged on load alone, nothing written.
        none, _ = bench("none")
        check(none["ceilings"]["record"] is None, "TPDRAFT_CEILINGS_FILE=none still names a record")
        # A float drafter does no integer FLOPs; q4a8 does int4 (layers) and int8 (projections) ones,
        # each at its own measured rate; q8a16 holds f32 weights, so all its FLOPs are float ones.
        check(none["draft_int8_gflop"] == 0 and none["draft_int4_gflop"] == 0, "a float drafter has integer FLOPs")
        check("machine_int8_gemm_gops" not in none, "a float drafter measured an int8 ceiling")
        for quant, ints in (("q4a8", (True, True)), ("q8a8+head", (True, False)), ("q8a16", (False, False))):
            q, _ = bench("none", "--quant", quant)
            int8 = q.get("machine_int8_gemm_gops", 0)
            int4 = q.get("machine_int4_gemm_gops", 0)
            check((int8 > 0, int4 > 0) == ints, f"{quant}: int ceilings {int8}, {int4}")
            check((q["draft_int8_gflop"] > 0, q["draft_int4_gflop"] > 0) == ints,
                  f"{quant}: int FLOPs {q['draft_int8_gflop']}, {q['draft_int4_gflop']}")
            float_gflop = q["draft_gflop"] - q["draft_int8_gflop"] - q["draft_int4_gflop"]
            compute_ms = float_gflop / q["machine_gemm_gflops"] * 1e3
            compute_ms += q["draft_int8_gflop"] / int8 * 1e3 if int8 else 0
            compute_ms += q["draft_int4_gflop"] / int4 * 1e3 if int4 else 0
            bytes_ms = q["draft_gbytes"] / q["machine_read_gbps"] * 1e3
            want = max(compute_ms, bytes_ms)
            check(abs(q["roofline_ms"] - want) <= 1e-9 * want, f"{quant}: roofline {q['roofline_ms']} ms, want {want}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("bench ceilings: record written, low marked, record raised, none honoured, integer rates used")
    return 0


if __name__ == "__main__":
    sys.exit(main())
