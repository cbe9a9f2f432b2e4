#!/usr/bin/env python3
"""Every bad input a careless user, a broken download or a confused launcher gives tpdraft, run
through the program and judged by what came back.

Usage: bad_inputs.py TPDRAFT_BIN [--mpi] [--list] [--jobs N]

Each case is a command line over a small checkpoint made by `tpdraft init` in a temporary
directory (a config key set out of range, an option given a bad value, a safetensors file
truncated or altered, a taps file with a NaN row, ranks given different arguments under mpirun
with --mpi) and the words its error must name (the key, the option, the file, the tensor). A
case ends as one of:

  clear error   exit 2 (command line) or 3 (input), the message naming its subject, no line
                printed twice
  unclear       a failure whose message names nothing of what was wrong, or repeats itself
  crash         killed by a signal, an uncaught exception, a sanitizer report
  hang          no answer within the time limit
  silent        exit 0: the bad input was taken as good

Prints the table and every case that was not a clear error; exit 1 when there is any.
"""

import concurrent.futures
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TIMEOUT_S = 60  # the sanitizer build is slow; a hang is a case that never ends
CRASH_WORDS = ("AddressSanitizer", "runtime error:", "LeakSanitizer", "terminate called", "Segmentation fault",
               "core dumped", "std::bad_alloc", "Aborted")


class Case:
    def __init__(self, group, name, argv, names, env=None, prepare=None, mpi=0):
        self.group, self.name, self.argv, self.names = group, name, argv, names
        self.env, self.prepare, self.mpi = env or {}, prepare, mpi


# ---- safetensors, read and written here (independently of the program) -------------------------

def read_st(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return header, data[8 + n:]


def write_st(path, header, body):
    """header: a dict, or the raw bytes of one (which need not be JSON)."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)


def tensor_names(path):
    return [k for k in read_st(path)[0] if k != "__metadata__"]


def poison(path, tensor, value, element=0):
    """Writes value (as the tensor's dtype) into one element of tensor."""
    header, body = read_st(path)
    t = header[tensor]
    raw = struct.pack("<e" if t["dtype"] == "F16" else "<f", value)
    raw = raw[2:] if t["dtype"] == "BF16" else raw  # bf16: the high half of the f32
    begin = t["data_offsets"][0] + element * len(raw)
    body = body[:begin] + raw + body[begin + len(raw):]
    write_st(path, header, body)


# ---- the cases --------------------------------------------------------------------------------

# `tpdraft draft` over the unaltered checkpoint {ck}, from token 1.
DRAFT = ["draft", "--drafter", "{ck}/drafter", "--target", "{ck}/target", "--taps", "{ck}/taps.safetensors",
         "--anchor", "1"]


def writing(fname, text):
    """A case's preparation: writes text into {tmp}/fname."""
    def prepare(tmp):
        with open(os.path.join(tmp, fname), "w") as f:
            f.write(text)
    return prepare


def config_cases(base_config):
    """`bench --config` with one key out of range: checked before any weight is generated."""
    cfg = json.load(open(base_config))
    bad = {
        "hidden_size": [-1, 0, 2 ** 58, 1e30, "64", None, 2.5],
        "num_hidden_layers": [-1, 0, 10 ** 9, 2 ** 40, "2", None],
        "num_attention_heads": [-1, 0, 2 ** 40, None],
        "num_key_value_heads": [-1, 0, 3, 8],
        "head_dim": [-1, 0, 2 ** 40],
        "intermediate_size": [-1, 0, 2 ** 58, None],
        "vocab_size": [-1, 0, 2 ** 58, 2 ** 58 + 1, 1e30, None],
        "rms_norm_eps": [-1, "x", float("nan")],
        "rope_theta": [-1, 0, "x"],
        "sliding_window": [-1, 0, 2 ** 62],
        "layer_types": [["bogus", "full_attention"], ["full_attention"], 5],
        "architectures": [["LlamaForCausalLM"], [], "x"],
    }
    bad_dflash = {
        "block_size": [-1, 0, 1, 2 ** 40],
        "target_layer_ids": [[], "x", [1, -4, 7]],
        "mask_token_id": [-1, 257, 2 ** 62, None],
        "conv_kernel_size": [-1, 0, 1000],
        "conv_group_size": [-1, 0, 7],
        "selector_rank": [-1, 0],
        "selector_top_k": [-1, 0, 258],
        "final_logit_softcapping": [-1, "x"],
        "output_multiplier": ["x", float("inf")],
    }
    cases = []

    def add(key, value, where):
        c = json.loads(json.dumps(cfg))
        target = c["dflash_config"] if where == "dflash" else c
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
        label = "missing" if value is None else json.dumps(value)
        fname = f"cfg-{key}-{len(cases)}.json"
        cases.append(Case("config.json key", f"{key} = {label}",
                          ["bench", "--config", "{tmp}/" + fname, "--ctx", "4", "--repeat", "1", "--warmup", "0"],
                          [key], prepare=writing(fname, json.dumps(c, allow_nan=True))))

    for where, keys in (("top", bad), ("dflash", bad_dflash)):
        for key, values in keys.items():
            for v in values:
                add(key, v, where)
    for name, text in [("empty", ""), ("not JSON", "{hidden_size: 64"), ("an array", "[1, 2]"),
                       ("truncated", json.dumps(cfg)[:40])]:
        cases.append(Case("config.json file", name, ["bench", "--config", "{tmp}/cfg-" + name + ".json"],
                          ["cfg-" + name + ".json"], prepare=writing(f"cfg-{name}.json", text)))
    cases.append(Case("config.json file", "missing", ["bench", "--config", "{tmp}/nothing.json"], ["nothing.json"]))
    cases.append(Case("config.json file", "a directory", ["bench", "--config", "{tmp}"], ["{tmp}"]))
    cases.append(Case("config.json file", "a FIFO", ["bench", "--config", "{tmp}/fifo"], ["fifo"]))
    return cases


def option_cases():
    draft = DRAFT
    bench = ["bench", "--config", "{repo}/configs/tiny-dflash2.json", "--ctx", "4", "--repeat", "1", "--warmup", "0"]
    info = ["info", "--drafter", "{ck}/drafter"]
    cases = []

    def bad(base, option, values, names=None, drop=None):
        for v in values:
            argv = list(base)
            if drop and drop in argv:
                i = argv.index(drop)
                del argv[i:i + 2]
            argv += [option, v] if v is not None else [option]
            cases.append(Case(f"{base[0]} options", f"{option} {v if v is not None else '(no value)'}", argv,
                              names or [option]))

    big = str(2 ** 63)
    bad(draft, "--anchor", ["-1", "257", big, "x", ""], names=["--anchor", "anchor token"], drop="--anchor")
    bad(draft, "--temperature", ["-1", "nan", "inf", "x"])
    bad(draft, "--top-k", ["-1", "x", big])
    bad(draft, "--top-p", ["0", "1.5", "nan", "-0.1"])
    bad(draft, "--seed", ["x", "-1", str(2 ** 64)])
    bad(draft, "--threads", ["-1", "100000", "x"])
    bad(draft, "--tp", ["-1", "3", "100000", "x"], names=["--tp", "tp = 3"])
    bad(draft, "--backend", ["bogus", ""])
    bad(draft, "--comm-timeout", ["-1", "x", "nan"])
    bad(draft, "--kv-dtype", ["f16", "bogus", ""])
    bad(draft, "--taps", ["{tmp}/none.safetensors", "{tmp}", "{tmp}/fifo", "{tmp}/empty", "{tmp}/text"],
        names=["--taps", "{tmp}"], drop="--taps")
    bad(draft, "--drafter", ["{tmp}/none", "{ck}/taps.safetensors", "{tmp}/emptydir"], names=["{tmp}", "{ck}"],
        drop="--drafter")
    bad(draft, "--target", ["{tmp}/none", "{tmp}/emptydir", "{ck}/drafter"], names=["{tmp}", "{ck}", "target",
                                                                                      "vocab", "embed"],
        drop="--target")
    bad(draft, "--dump", ["{tmp}", "/dev/null", "{tmp}/nodir/x.safetensors", "{tmp}/link"], names=["--dump"])
    bad(draft, "--bogus", [None, "1"], names=["--bogus"])
    cases.append(Case("draft options", "no --taps", draft[:5] + ["--anchor", "1"], ["--taps"]))
    cases.append(Case("draft options", "no --drafter", ["draft"] + draft[3:], ["--drafter"]))
    bad(bench, "--ctx", ["-3", big, "x", "1024,-3", "4,x"])
    bad(bench, "--kv-dtype", ["int8"])
    bad(bench, "--batch", ["0", "-1", "x", str(2 ** 40)])
    bad(bench, "--repeat", ["0", "-1", "x"])
    bad(bench, "--warmup", ["-1", "x"])
    bad(bench, "--dtype", ["bogus", "int8"])
    bad(bench, "--graphs", ["bogus"])
    bad(bench, "--tp", ["3", "-1"], names=["--tp", "tp = 3"])
    bad(bench, "--threads", ["-1", "100000"])
    cases.append(Case("bench options", "neither --config nor --drafter", ["bench"], ["--config"]))
    bad(info, "--tp", ["3", "0", "-2"], names=["--tp", "tp = 3"])
    bad(info, "--sessions", ["0", "-1", "x"])
    bad(info, "--ctx", ["-1", "x"])
    bad(info, "--dtype", ["bogus"])
    init = ["init", "--config", "{repo}/configs/tiny-dflash.json", "--out", "{tmp}/new"]
    bad(init, "--target-vocab", ["-5", "x", str(2 ** 62), "100"], names=["--target-vocab", "target"])
    bad(init, "--taps", ["-1", str(2 ** 40), "x"], names=["--taps", "taps"])
    bad(init, "--dtype", ["bogus"])
    bad(init, "--seed", ["x"])
    bad(init, "--out", ["{ck}/drafter/model.safetensors", "{ck}/drafter/model.safetensors/sub", "{ck}/drafter"],
        names=["--out", "{ck}"], drop="--out")
    bad(init, "--config", ["{tmp}/none.json"], names=["none.json"], drop="--config")
    cases.append(Case("commands", "no command", [], ["command"]))
    cases.append(Case("commands", "unknown command", ["drfat"], ["drfat"]))
    cases.append(Case("environment", "TPDRAFT_LOG_LEVEL typo", draft, ["TPDRAFT_LOG_LEVEL"],
                      env={"TPDRAFT_LOG_LEVEL": "debgu"}))
    return cases


def header_change(fn, file):
    """A change to a checkpoint copy: the header of its safetensors `file` replaced by fn(header),
    a dict or raw bytes; the data stays."""
    def change(d):
        p = os.path.join(d, file)
        header, body = read_st(p)
        write_st(p, fn(header), body)
    return change


def config_edit(fn, file="drafter/config.json"):
    """A change to a checkpoint copy: its config.json passed through fn (which edits it in place)."""
    def change(d):
        p = os.path.join(d, file)
        c = json.load(open(p))
        fn(c)
        json.dump(c, open(p, "w"))
    return change


def altered(group, argv, ck, copy_name):
    """add(name, change, names): a case of `group` running argv over {tmp}/copy_name, a copy of the
    checkpoint ck that change(copy) alters."""
    cases = []

    def add(name, change, names):
        def prepare(tmp):
            shutil.copytree(ck, os.path.join(tmp, copy_name), symlinks=True)
            change(os.path.join(tmp, copy_name))
        cases.append(Case(group, name, argv, names, prepare=prepare))
    return cases, add


def checkpoint_cases(ck):
    """The drafter's and the target's safetensors and config, altered one way at a time."""
    draft = [a.replace("{ck}", "{tmp}/ck") for a in DRAFT]  # over the altered copy in {tmp}/ck
    cases, add = altered("checkpoint", draft, ck, "ck")
    dfile = "drafter/model.safetensors"
    tfile = "target/model.safetensors"
    dconfig = "drafter/config.json"

    size = os.path.getsize(os.path.join(ck, dfile))
    for cut in [0, 4, 8, 9, 100, size // 2, size - 1]:
        add(f"drafter safetensors truncated to {cut} bytes",
            lambda d, cut=cut: os.truncate(os.path.join(d, dfile), cut), ["model.safetensors"])

    def set_len(d, n):
        with open(os.path.join(d, dfile), "r+b") as f:
            f.write(struct.pack("<Q", n))
    add("header length 2^63", lambda d: set_len(d, 2 ** 63), ["model.safetensors"])
    add("header length past the end", lambda d: set_len(d, size), ["model.safetensors"])
    add("header not JSON", header_change(lambda h: b"{not json", dfile), ["model.safetensors"])
    add("header a JSON array", header_change(lambda h: b"[1, 2, 3]", dfile), ["model.safetensors"])
    names = tensor_names(os.path.join(ck, dfile))
    first = sorted(names)[0]
    fc = next(n for n in names if n.startswith("fc"))
    down = next(n for n in names if "down_proj" in n)
    norm = next(n for n in names if "norm" in n)
    q = next(n for n in names if "k_proj.weight" in n)  # not square: [kv heads x D, H]

    def edit(tensor, **fields):
        def fn(h):
            h[tensor].update(fields)
            return h
        return fn
    for what, fields in [("offsets past the end", {"data_offsets": [0, 10 ** 9]}),
                         ("offsets reversed", {"data_offsets": [8, 0]}), ("dtype Q4", {"dtype": "Q4"}),
                         ("dtype I32", {"dtype": "I32"}), ("negative shape", {"shape": [-1, 64]}),
                         ("shape product overflows", {"shape": [2 ** 40, 2 ** 40]})]:
        add(f"{first}: {what}", header_change(edit(first, **fields), dfile), [first])
    qt = read_st(os.path.join(ck, dfile))[0][q]
    (rows, cols), (begin, end) = qt["shape"], qt["data_offsets"]
    add(f"{q}: shape transposed", header_change(edit(q, shape=[cols, rows]), dfile), [q])
    add(f"{q}: one row short",
        header_change(edit(q, shape=[rows - 1, cols], data_offsets=[begin, end - 2 * cols]), dfile), [q])

    def drop(tensor):
        return lambda h: {k: v for k, v in h.items() if k != tensor}
    add(f"{fc} missing", header_change(drop(fc), dfile), [fc])
    add(f"{norm} missing", header_change(drop(norm), dfile), [norm])

    def duplicate(h):
        text = json.dumps(h)
        entry = json.dumps({first: h[first]})[1:-1]
        return ("{" + entry + ", " + text[1:]).encode()
    add(f"{first} listed twice", header_change(duplicate, dfile), [first])
    for tensor in (fc, down, norm, q):
        for value in (float("nan"), float("inf")):
            add(f"{tensor}: {value} in the weights",
                lambda d, tensor=tensor, value=value: poison(os.path.join(d, dfile), tensor, value), [tensor])
    tnames = tensor_names(os.path.join(ck, tfile))
    hidden = read_st(os.path.join(ck, tfile))[0][tnames[0]]["shape"][1]
    for tensor in tnames:
        # In the anchor's row (token 1): the embedding is read by row, and row 0 is never used.
        add(f"target {tensor}: NaN in row 1",
            lambda d, tensor=tensor: poison(os.path.join(d, tfile), tensor, float("nan"), element=hidden), [tensor])
        add(f"target {tensor} missing", header_change(drop(tensor), tfile), [tensor, "lm_head", "embed"])
    add("target safetensors truncated", lambda d: os.truncate(os.path.join(d, tfile), 50),
        ["model.safetensors"])
    add("drafter config.json missing", lambda d: os.remove(os.path.join(d, dconfig)), ["config.json"])
    add("drafter config.json a directory",
        lambda d: (os.remove(os.path.join(d, dconfig)), os.mkdir(os.path.join(d, dconfig))), ["config.json"])
    add("drafter config.json not JSON", lambda d: open(os.path.join(d, dconfig), "w").write("{"), ["config.json"])

    # The config no longer matches the tensors: the shapes must disagree loudly.
    add("config hidden_size 32 against 64-wide tensors", config_edit(lambda c: c.update(hidden_size=32)),
        ["hidden_size", "shape", "expected"])
    add("config intermediate_size 40 against 80", config_edit(lambda c: c.update(intermediate_size=40)),
        ["intermediate_size", "shape", "expected"])
    add("config vocab 300 against a 257-row head", config_edit(lambda c: c.update(vocab_size=300)),
        ["vocab", "shape", "expected"])
    add("config target_layer_ids of 2 against fc of 3 taps",
        config_edit(lambda c: c["dflash_config"].update(target_layer_ids=[1, 4])), ["fc", "taps", "target_layer_ids"])
    for what, make in (("a FIFO", os.mkfifo), ("a directory", os.mkdir)):
        add(f"model.safetensors {what}",
            lambda d, make=make: (os.remove(os.path.join(d, dfile)), make(os.path.join(d, dfile))),
            ["model.safetensors"])

    def sharded(shard_name):
        def change(d):
            os.rename(os.path.join(d, dfile), os.path.join(d, "drafter/model-00001-of-00001.safetensors"))
            index = {"metadata": {}, "weight_map": {n: shard_name for n in names}}
            json.dump(index, open(os.path.join(d, "drafter/model.safetensors.index.json"), "w"))
        return change
    add("index naming ../../etc/passwd", sharded("../../etc/passwd"), ["../../etc/passwd"])
    add("index naming a missing shard", sharded("model-00002-of-00002.safetensors"),
        ["model-00002-of-00002.safetensors"])
    add("index naming an absolute path", sharded("/etc/hostname"), ["/etc/hostname"])

    # The taps file.
    taps = "taps.safetensors"
    for value in ("NaN", "Inf"):
        add(f"taps: {value} in row 0",
            lambda d, value=value: poison(os.path.join(d, taps), "taps", float(value)), ["row"])
    add("taps: no tensor 'taps'", header_change(lambda h: {"x" if k == "taps" else k: v for k, v in h.items()}, taps),
        ["taps"])
    n, width = read_st(os.path.join(ck, taps))[0]["taps"]["shape"]
    add("taps: wrong width", header_change(edit("taps", shape=[n * 2, width // 2]), taps), ["taps"])
    add("taps: 1-D", header_change(edit("taps", shape=[n * width]), taps), ["taps"])
    add("taps: truncated", lambda d: os.truncate(os.path.join(d, taps), 60), [taps])
    add("taps: dtype I64", header_change(edit("taps", dtype="I64", shape=[n, width // 2]), taps),
        ["taps"])
    return cases


def draft_vocab_cases(ck, sck):
    """Token maps, tpdraft vocab, init --layout and speculators checkpoints ({sck}: tiny-dflash in
    the speculators layout with a draft vocabulary of 100 ids), each bad one way."""
    cases = []
    bench = ["bench", "--config", "{repo}/configs/tiny-dflash2.json", "--ctx", "4", "--repeat", "1", "--warmup", "0"]
    serve = ["serve", "--drafter", "{ck}/drafter", "--target", "{ck}/target", "--listen", "ipc://{tmp}/s.sock"]
    token_ids = struct.pack("<3q", 1, 2, 3)
    maps = [  # file name, content (text, or a safetensors header and body), what the error names
        ("range.json", "[1, 2, 257]", ["range.json", "257"]),
        ("negative.json", "[4, -1]", ["negative.json", "-1"]),
        ("float.json", "[1.5, 2]", ["float.json", "1.5"]),
        ("object.json", '{"ids": [1]}', ["object.json", "list"]),
        ("empty.json", "[]", ["empty.json", "no token"]),
        ("broken.json", "[1, 2", ["broken.json", "JSON"]),
        ("two.json", "[5, 6]", ["two.json", "selector_top_k"]),  # DFlash 2 draws among 4 candidates
        ("map.pt", "PK\x03\x04 a torch.save zip", ["map.pt", "torch.load"]),
        ("noids.safetensors", ({"ids": {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]}}, token_ids),
         ["noids.safetensors", "token_ids"]),
        ("f32.safetensors", ({"token_ids": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, token_ids[:8]),
         ["f32.safetensors", "token_ids"]),
        ("2d.safetensors", ({"token_ids": {"dtype": "I64", "shape": [1, 3], "data_offsets": [0, 24]}}, token_ids),
         ["2d.safetensors", "token_ids"]),
    ]

    def map_file(fname, content):
        def prepare(tmp):
            if isinstance(content, tuple):
                write_st(os.path.join(tmp, fname), *content)
            else:
                with open(os.path.join(tmp, fname), "w") as f:
                    f.write(content)
        return prepare
    for base in (DRAFT, bench, ["info", "--drafter", "{ck}/drafter"], serve):
        for fname, content, names in maps:
            cases.append(Case(f"{base[0]} --token-map", fname, base + ["--token-map", "{tmp}/" + fname], names,
                              prepare=map_file(fname, content)))
        for where in ("{tmp}/none.json", "{tmp}", "{tmp}/fifo"):
            cases.append(Case(f"{base[0]} --token-map", where, base + ["--token-map", where], ["--token-map", "{tmp}"]))
    cases.append(Case("draft --token-map", "over a draft vocabulary of its own",
                      [a.replace("{ck}", "{sck}") for a in DRAFT] + ["--token-map", "{tmp}/m.json"],
                      ["draft vocabulary of its own"], prepare=writing("m.json", "[1, 2, 3]")))
    for v in ("0", "-1", "258", "x"):
        cases.append(Case("bench --token-map-size", v, bench + ["--token-map-size", v], ["--token-map-size", v]))
    cases.append(Case("bench --token-map-size", "with --token-map", bench + ["--token-map-size", "9", "--token-map",
                                                                             "{repo}/configs/tiny-dflash.json"],
                      ["--token-map"]))
    cases.append(Case("info --token-map-size", "2 under a selector of 4",
                      ["info", "--drafter", "{ck}/drafter", "--token-map-size", "2"], ["selector_top_k"]))

    vocab = ["vocab", "--vocab-size", "257", "--size", "10", "--out", "{tmp}/out.json"]
    corpora = [("words.txt", "1 2 three\n", ["words.txt", "line 1"]),
               ("range.txt", "1 2\n3 257\n", ["range.txt", "line 2", "257"]),
               ("huge.txt", "1 99999999999999999999999\n", ["huge.txt", "line 1"]),
               ("empty.txt", "", ["no token"]),
               ("floats.safetensors", ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, token_ids[:8]),
                ["floats.safetensors", "integer"]),
               ("range.safetensors", ({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}},
                                      struct.pack("<q", 300)), ["range.safetensors", "300"])]
    for fname, content, names in corpora:
        cases.append(Case("vocab --corpus", fname, vocab + ["--corpus", "{tmp}/" + fname], names,
                          prepare=map_file(fname, content)))
    for where in ("{tmp}/none.txt", "{tmp}", "{tmp}/fifo"):
        cases.append(Case("vocab --corpus", where, vocab + ["--corpus", where], ["--corpus", "{tmp}"]))
    good = ["vocab", "--corpus", "{tmp}/c.txt"]
    for argv, names in [(["--vocab-size", "257", "--size", "0"], ["--size"]),
                        (["--vocab-size", "257", "--size", "x"], ["--size"]),
                        (["--vocab-size", "257", "--size", "300"], ["--size 300"]),
                        (["--vocab-size", "0", "--size", "3"], ["--vocab-size"]),
                        (["--size", "3"], ["--vocab-size"]),
                        (["--vocab-size", "257", "--drafter", "{ck}/drafter", "--size", "3"], ["--drafter"]),
                        (["--vocab-size", "257", "--size", "3", "--keep", "-1"], ["--keep"]),
                        (["--vocab-size", "257", "--size", "3", "--keep", "257"], ["--keep 257"]),
                        (["--vocab-size", "257", "--size", "1", "--keep", "3,4"], ["--keep"]),
                        (["--vocab-size", "257", "--size", "3", "--out", "{tmp}/nodir/m.json"], ["m.json"]),
                        (["--vocab-size", "257", "--size", "3", "--out", "{tmp}"], ["{tmp}"])]:
        out = [] if "--out" in argv else ["--out", "{tmp}/out.json"]
        cases.append(Case("vocab options", " ".join(argv), good + argv + out, names,
                          prepare=writing("c.txt", "1 2 3\n")))

    init = ["init", "--out", "{tmp}/new"]
    for argv, names in [(["--config", "{repo}/configs/tiny-dflash.json", "--layout", "bogus"], ["--layout"]),
                        (["--config", "{repo}/configs/tiny-dflash2.json", "--layout", "speculators"], ["DFlash 2"]),
                        (["--config", "{repo}/configs/tiny-dflash.json", "--draft-vocab", "10"], ["--draft-vocab"]),
                        (["--config", "{repo}/configs/tiny-dflash.json", "--layout", "speculators", "--draft-vocab",
                          "300"], ["--draft-vocab 300"]),
                        (["--config", "{repo}/configs/tiny-dflash.json", "--layout", "speculators", "--draft-vocab",
                          "0"], ["--draft-vocab"]),
                        (["--config", "{repo}/configs/tiny-dflash.json", "--target-embedding"],
                         ["--target-embedding"])]:
        cases.append(Case("init --layout", " ".join(argv[2:]), init + argv, names))

    # The speculators checkpoint altered one way at a time.
    dfile = "drafter/model.safetensors"
    altered_cases, add = altered("speculators checkpoint", [a.replace("{ck}", "{tmp}/sck") for a in DRAFT], sck, "sck")
    header = read_st(os.path.join(sck, dfile))[0]
    d2t_at, t2d_at = header["d2t"]["data_offsets"], header["t2d"]["data_offsets"]
    for tensor in ("d2t", "lm_head.weight"):
        add(f"{tensor} missing" if tensor == "d2t" else "lm_head.weight shorter than the draft vocabulary",
            header_change(lambda h, tensor=tensor: {k: v for k, v in h.items() if k != tensor}
                          if tensor == "d2t" else dict(h, **{tensor: dict(h[tensor], shape=[99, 64],
                                                             data_offsets=[h[tensor]["data_offsets"][0],
                                                                           h[tensor]["data_offsets"][1] - 128])}),
                          dfile),
            [tensor])
    add("d2t as F32", header_change(lambda h: dict(h, d2t=dict(h["d2t"], dtype="F32", shape=[200])), dfile),
        ["d2t", "F32"])
    add("d2t one entry short", header_change(lambda h: dict(h, d2t=dict(h["d2t"], shape=[99],
                                                                         data_offsets=[d2t_at[0], d2t_at[1] - 8])),
                                             dfile), ["d2t", "99"])

    def d2t_value(index, value):
        def change(d):
            path = os.path.join(d, dfile)
            h, body = read_st(path)
            at = h["d2t"]["data_offsets"][0] + 8 * index
            write_st(path, h, body[:at] + struct.pack("<q", value) + body[at + 8:])
        return change
    add("d2t maps past the vocabulary", d2t_value(99, 10 ** 6), ["d2t", "outside"])
    add("d2t maps two rows to one id", d2t_value(1, -1), ["mapped twice", "d2t"])

    def t2d_flip(d):
        path = os.path.join(d, dfile)
        h, body = read_st(path)
        at = h["t2d"]["data_offsets"][0]
        flipped = bytes([1 - body[at + i] for i in range(t2d_at[1] - t2d_at[0])])
        write_st(path, h, body[:at] + flipped + body[at + len(flipped):])
    add("t2d disagrees with d2t", t2d_flip, ["t2d", "d2t", "disagree"])
    for key, value, names in [("speculators_model_type", "eagle3", ["speculators_model_type", "eagle3"]),
                              ("projector_type", "domino", ["projector_type", "domino"]),
                              ("sample_from_anchor", True, ["sample_from_anchor"]),
                              ("target_hidden_size", 128, ["target_hidden_size"]),
                              ("aux_hidden_state_layer_ids", [0, 3], ["aux_hidden_state_layer_ids"]),
                              ("aux_hidden_state_layer_ids", [2, 4, 6], ["fc", "taps"]),
                              ("draft_vocab_size", 301, ["draft_vocab_size"]),
                              ("draft_vocab_size", 50, ["d2t", "50"]),
                              ("mask_token_id", 300, ["mask_token_id"]),
                              ("transformer_layer_config", "x", ["transformer_layer_config"])]:
        add(f"config {key} = {json.dumps(value)}", config_edit(lambda c, key=key, value=value: c.update({key: value})),
            names)
    add("config transformer_layer_config.hidden_act gelu",
        config_edit(lambda c: c["transformer_layer_config"].update(hidden_act="gelu")), ["hidden_act", "gelu"])
    add("config without block_size or speculative tokens",
        config_edit(lambda c: (c.pop("block_size"), c.pop("speculators_config"))), ["block_size"])
    return cases + altered_cases


def mpi_cases():
    """Two ranks given different arguments: an error naming the argument, never a hang."""
    cases = []
    for option, v0, v1 in [("--anchor", "1", "2"), ("--temperature", "0.5", "0.7"),
                           ("--dump", "{tmp}/a.safetensors", "{tmp}/b.safetensors"),
                           ("--tp", "1", "2"), ("--seed", "1", "2")]:
        base = DRAFT[:-2] if option == "--anchor" else DRAFT
        cases.append(Case("ranks that disagree", f"different {option}",
                          (base + [option, v0], base + [option, v1]), [option], mpi=2))
    cases.append(Case("ranks that disagree", "different command",
                      (DRAFT, ["info", "--drafter", "{ck}/drafter"]), ["command", "draft", "info"],
                      mpi=2))
    return cases


# ---- running and judging ------------------------------------------------------------------------

def fill(s, where):
    for k, v in where.items():
        s = s.replace("{" + k + "}", v)
    return s


def run_case(binary, ck, case):
    with tempfile.TemporaryDirectory(prefix="tpdraft-bad-", ignore_cleanup_errors=True) as tmp:
        os.mkdir(os.path.join(tmp, "emptydir"))
        os.mkfifo(os.path.join(tmp, "fifo"))
        open(os.path.join(tmp, "empty"), "w").close()
        open(os.path.join(tmp, "text"), "w").write("not a safetensors file\n")
        os.symlink(os.path.join(tmp, "text"), os.path.join(tmp, "link"))
        where = {"tmp": tmp, "ck": ck, "sck": ck + "-speculators", "repo": REPO}
        if case.prepare:
            case.prepare(tmp)
        env = dict(os.environ, **case.env)
        if case.mpi:
            script = os.path.join(tmp, "rank.sh")
            a0, a1 = (shlex.join([binary] + [fill(a, where) for a in argv]) for argv in case.argv)
            with open(script, "w") as f:
                f.write(f'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec {a0}; else exec {a1}; fi\n')
            cmd = ["mpirun", "-q", "--allow-run-as-root", "--oversubscribe", "-np", str(case.mpi), "sh", script]
        else:
            cmd = [binary] + [fill(a, where) for a in case.argv]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, errors="replace")
        except subprocess.TimeoutExpired:
            return case, "hang", f"no answer in {TIMEOUT_S} s"
        out = p.stdout + p.stderr
        names = [fill(n, where) for n in case.names]
        if p.returncode < 0 or any(w in out for w in CRASH_WORDS):
            return case, "crash", f"exit {p.returncode}: {out[-600:]}"
        if p.returncode == 0:
            return case, "silent", out[-300:]
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        repeated = sorted({l for l in lines if lines.count(l) > 1 and "error" in l.lower()})
        if p.returncode not in (2, 3) or not any(n in out for n in names) or repeated:
            why = (f"exit {p.returncode}" if p.returncode not in (2, 3) else
                   f"printed twice: {repeated[0]}" if repeated else f"names none of {names}")
            return case, "unclear", f"{why}: {out[-400:]}"
        return case, "clear error", ""


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    binary = os.path.abspath(argv[1])
    with_mpi = "--mpi" in argv
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else (os.cpu_count() or 2)
    config = os.path.join(REPO, "configs", "tiny-dflash2.json")
    with tempfile.TemporaryDirectory(prefix="tpdraft-bad-inputs-", ignore_cleanup_errors=True) as work:
        ck = os.path.join(work, "ck")
        subprocess.run([binary, "init", "--config", config, "--out", ck, "--taps", "6"], check=True,
                       capture_output=True)
        sck = ck + "-speculators"
        subprocess.run([binary, "init", "--config", os.path.join(REPO, "configs", "tiny-dflash.json"), "--out", sck,
                        "--taps", "6", "--layout", "speculators", "--draft-vocab", "100"], check=True,
                       capture_output=True)
        cases = (config_cases(config) + option_cases() + checkpoint_cases(ck) + draft_vocab_cases(ck, sck) +
                 (mpi_cases() if with_mpi else []))
        if "--list" in argv:
            for c in cases:
                print(f"{c.group}: {c.name}")
            return 0
        # The unaltered inputs must work, or every "error" below would prove nothing.
        for checkpoint in (ck, sck):
            good = subprocess.run([binary] + [fill(a, {"ck": checkpoint}) for a in DRAFT], capture_output=True,
                                  text=True)
            if good.returncode != 0:
                print(f"the unaltered checkpoint {checkpoint} does not draft:\n" + good.stdout + good.stderr)
                return 1
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda c: run_case(binary, ck, c), cases))
    kinds = ["clear error", "unclear", "crash", "hang", "silent"]
    groups = list(dict.fromkeys(c.group for c, _, _ in results))  # in the order of the cases
    print(f"{'inputs':<24} {'cases':>5} " + " ".join(f"{k:>11}" for k in kinds))
    for g in groups + ["all"]:
        rs = [r for r in results if g == "all" or r[0].group == g]
        print(f"{g:<24} {len(rs):>5} " + " ".join(f"{sum(1 for r in rs if r[1] == k):>11}" for k in kinds))
    bad = [r for r in results if r[1] != "clear error"]
    for case, kind, detail in bad:
        print(f"\n{kind.upper()}: {case.group}: {case.name}\n  {detail.strip()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
