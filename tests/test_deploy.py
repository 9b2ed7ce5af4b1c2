"""``dse deploy``: each engine's command uses only flags its documentation lists, with the design's
values; the manifest is Kubernetes YAML with the object's required fields; bad inputs are one line.

The documented flag lists below are copied from the engines' documentation, independent of
``dse.present.deploy``'s tables (a flag the module invents, or misspells, fails here):
- vLLM v0.8.5, "Engine Arguments", https://docs.vllm.ai/en/v0.8.5/serving/engine_args.html
  (the ``vllm serve`` usage block; 2025-04).
- SGLang "Server Arguments", https://docs.sglang.io/advanced_features/server_arguments.html
  (docs/advanced_features/server_arguments.md at sgl-project/sglang b36e8e198b71553316b55bce53de6ecf9b3a9a47).
- TensorRT-LLM ``trtllm-serve``: https://nvidia.github.io/TensorRT-LLM/0.18.2/commands/trtllm-serve.html
  (options list), https://nvidia.github.io/TensorRT-LLM/0.20.0rc1/commands/trtllm-serve.html (--ep_size),
  https://nvidia.github.io/TensorRT-LLM/1.0.0/commands/trtllm-serve/run-benchmark-with-trtllm-serve.html
  (--extra_llm_api_options).
- Kubernetes: a Deployment needs apiVersion, kind, metadata.name, spec.selector and spec.template whose
  labels the selector matches, containers with a name and an image
  (https://kubernetes.io/docs/concepts/workloads/controllers/deployment/); names are RFC 1123 labels.
- NVIDIA Dynamo DynamoGraphDeployment (nvidia.com/v1alpha1): spec.services.<name> with componentType,
  replicas, resources.limits.gpu, extraPodSpec.mainContainer (ai-dynamo/dynamo,
  components/backends/vllm/deploy/agg.yaml and README.md).
"""
from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from dse.study.cli import main

VLLM_DOC = {
    "--host", "--port", "--model", "--tokenizer", "--trust-remote-code", "--download-dir", "--load-format",
    "--dtype", "--kv-cache-dtype", "--max-model-len", "--distributed-executor-backend",
    "--pipeline-parallel-size", "--tensor-parallel-size", "--data-parallel-size", "--enable-expert-parallel",
    "--block-size", "--enable-prefix-caching", "--seed", "--swap-space", "--cpu-offload-gb",
    "--gpu-memory-utilization", "--max-num-batched-tokens", "--max-num-seqs", "--quantization",
    "--enforce-eager", "--enable-chunked-prefill", "--speculative-config", "--served-model-name",
}
VLLM_CHOICES = {"--kv-cache-dtype": {"auto", "fp8", "fp8_e5m2", "fp8_e4m3"},
                "--block-size": {"8", "16", "32", "64", "128"},
                "--quantization": {"aqlm", "awq", "deepspeedfp", "tpu_int8", "fp8", "ptpc_fp8", "fbgemm_fp8",
                                   "modelopt", "nvfp4", "marlin", "gguf", "gptq_marlin_24", "gptq_marlin",
                                   "awq_marlin", "gptq", "compressed-tensors", "bitsandbytes", "qqq", "hqq",
                                   "experts_int8", "neuron_quant", "ipex", "quark", "moe_wna16"},
                "--dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"}}
SGLANG_DOC = {
    "--model-path", "--model", "--tokenizer-path", "--trust-remote-code", "--context-length", "--host", "--port",
    "--dtype", "--quantization", "--kv-cache-dtype", "--mem-fraction-static", "--max-running-requests",
    "--max-total-tokens", "--chunked-prefill-size", "--max-prefill-tokens", "--page-size",
    "--tensor-parallel-size", "--tp-size", "--pipeline-parallel-size", "--pp-size", "--data-parallel-size",
    "--dp-size", "--expert-parallel-size", "--ep-size", "--ep", "--speculative-algorithm",
    "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--served-model-name", "--enable-dp-attention",
}
SGLANG_CHOICES = {"--kv-cache-dtype": {"auto", "fp8_e5m2", "fp8_e4m3"},
                  "--quantization": {"awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes",
                                     "gguf", "modelopt", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8",
                                     "moe_wna16", "qoq", "w4afp8", "mxfp4"},
                  "--speculative-algorithm": {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"},
                  "--dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"}}
TRTLLM_DOC = {"--tokenizer", "--host", "--port", "--backend", "--max_beam_width", "--max_batch_size",
              "--max_num_tokens", "--max_seq_len", "--tp_size", "--pp_size", "--ep_size",
              "--kv_cache_free_gpu_memory_fraction", "--trust_remote_code", "--extra_llm_api_options"}
TRTLLM_CHOICES = {"--backend": {"pytorch"}}
DOCS = {"vllm": (["vllm", "serve"], VLLM_DOC, VLLM_CHOICES),
        "sglang": (["python3", "-m", "sglang.launch_server"], SGLANG_DOC, SGLANG_CHOICES),
        "trtllm": (["trtllm-serve"], TRTLLM_DOC, TRTLLM_CHOICES)}
GPU = "nvidia.com/gpu"
RFC1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

#: three designs, as the workload flags give them, with the values their commands must carry
DENSE = ["--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "8", "--weights", "fp8", "--activations",
         "fp8", "--kv", "fp8", "--concurrency", "64", "--max-running", "256", "--prefill-chunk", "4096",
         "--kv-block", "32"]
MOE = ["--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--tp", "2", "--ep", "4", "--batch", "32"]
SPEC = ["--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4", "--spec-draft", "llama-3.2-1b-instruct",
        "--spec-tokens", "4", "--spec-acceptance", "0.7", "--concurrency", "16"]
PIPE = ["--model", "llama-3.1-405b", "--hardware", "h100-sxm", "--tp", "8", "--pp", "2", "--weights", "fp8",
        "--activations", "fp8", "--batch", "8"]


def deploy(tmp_path, argv, engine, *extra):
    """(the engine's argv as the Deployment's container runs it, the manifest's objects, the
    options file TensorRT-LLM reads as a dict or None) of ``dse deploy``."""
    out = tmp_path / f"{engine}-{abs(hash(tuple(argv + list(extra))))}"
    assert main(["deploy", *argv, "--engine", engine, "--out", str(out), *extra]) == 0
    docs = list(yaml.safe_load_all((out / "manifest.yaml").read_text()))
    script = (out / "launch.sh").read_text()
    options = None
    m = re.search(r"cat > trtllm-options.yaml <<'EOF'\n(.*?)\nEOF", script, re.S)
    if m:
        options = yaml.safe_load(m.group(1))
    return docs, script, options


def container_argv(docs) -> list[str]:
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    if c["command"][:2] == ["/bin/sh", "-c"]:
        return shlex.split(c["args"][0].rsplit("exec ", 1)[1])
    return c["command"] + c["args"]


def flags_of(argv: list[str], engine: str) -> dict:
    """{flag: value or True} of ``argv``, after checking its program and that every flag is one
    the engine's documentation lists (and a value among its documented choices)."""
    program, documented, choices = DOCS[engine]
    assert argv[:len(program)] == program
    out, i = {}, len(program) + (0 if engine == "sglang" else 1)      # vllm serve MODEL, trtllm-serve MODEL
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), argv[i:]
        assert flag in documented, f"{engine}: {flag} is not in its documented flags"
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
        if flag in choices:
            assert value in choices[flag], f"{engine}: {flag} {value} not among {sorted(choices[flag])}"
        out[flag] = value
        i += 1 if value is True else 2
    return out


def check_deployment(docs, gpus: int, replicas: int = 1):
    dep, svc = docs
    assert (dep["apiVersion"], dep["kind"]) == ("apps/v1", "Deployment")
    assert RFC1123.match(dep["metadata"]["name"]) and len(dep["metadata"]["name"]) <= 63
    sel = dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert sel and all(labels.get(k) == v for k, v in sel.items())
    assert dep["spec"]["replicas"] == replicas
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["name"] and c["image"] and c["args"]
    assert c["resources"]["limits"][GPU] == str(gpus)
    assert (svc["apiVersion"], svc["kind"]) == ("v1", "Service")
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["containerPort"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_dense_tp8_fp8(tmp_path, engine):
    docs, _, options = deploy(tmp_path, DENSE, engine)
    check_deployment(docs, gpus=8)
    f = flags_of(container_argv(docs), engine)
    if engine == "vllm":
        assert (f["--tensor-parallel-size"], f["--max-num-seqs"], f["--max-num-batched-tokens"]) == ("8", "256", "4096")
        assert (f["--kv-cache-dtype"], f["--block-size"], f["--quantization"]) == ("fp8_e4m3", "32", "fp8")
    elif engine == "sglang":
        assert (f["--tp-size"], f["--max-running-requests"], f["--chunked-prefill-size"]) == ("8", "256", "4096")
        assert (f["--kv-cache-dtype"], f["--page-size"], f["--quantization"]) == ("fp8_e4m3", "32", "fp8")
    else:
        assert (f["--tp_size"], f["--max_batch_size"], f["--max_num_tokens"]) == ("8", "256", "4096")
        assert options["kv_cache_config"] == {"dtype": "fp8", "tokens_per_block": 32}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_moe_expert_parallel(tmp_path, engine):
    docs, script, options = deploy(tmp_path, MOE, engine)
    check_deployment(docs, gpus=2 * 4)
    f = flags_of(container_argv(docs), engine)
    if engine == "vllm":       # tp inside each of the ep data-parallel ranks, experts over all of them
        assert (f["--tensor-parallel-size"], f["--data-parallel-size"], f["--enable-expert-parallel"]) == ("2", "4", True)
    elif engine == "sglang":
        assert (f["--tp-size"], f["--ep-size"], f["--dp-size"], f["--enable-dp-attention"]) == ("8", "8", "4", True)
    else:
        assert (f["--tp_size"], f["--ep_size"]) == ("8", "4") and options["enable_attention_dp"] is True
    assert "expert parallel" in script and "static batch of 32" in script     # the mapping said, not silent
    assert f.get("--max-num-seqs", f.get("--max-running-requests", f.get("--max_batch_size"))) == "32"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_speculative_decoding(tmp_path, engine):
    docs, script, _ = deploy(tmp_path, SPEC, engine)
    check_deployment(docs, gpus=4)
    f = flags_of(container_argv(docs), engine)
    if engine == "vllm":
        cfg = json.loads(f["--speculative-config"])
        assert cfg == {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}
    elif engine == "sglang":
        assert f["--speculative-algorithm"] == "STANDALONE"
        assert f["--speculative-draft-model-path"] == "meta-llama/Llama-3.2-1B-Instruct"
        assert f["--speculative-num-steps"] == "4"
    else:                       # not written for TensorRT-LLM: said so
        assert "spec_draft llama-3.2-1b-instruct" in script and "left out" in script


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_pipeline_parallel(tmp_path, engine):
    docs, script, _ = deploy(tmp_path, PIPE, engine)
    check_deployment(docs, gpus=16)
    f = flags_of(container_argv(docs), engine)
    pp = {"vllm": "--pipeline-parallel-size", "sglang": "--pp-size", "trtllm": "--pp_size"}[engine]
    tp = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size", "trtllm": "--tp_size"}[engine]
    assert (f[tp], f[pp]) == ("8", "2")
    assert "16 GPUs in one pod" in script


def test_dynamo_manifest(tmp_path):
    image = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.1"
    (dgd,), _, _ = deploy(tmp_path, DENSE, "vllm", "--manifest", "dynamo", "--image", image)
    assert (dgd["apiVersion"], dgd["kind"]) == ("nvidia.com/v1alpha1", "DynamoGraphDeployment")
    assert RFC1123.match(dgd["metadata"]["name"])
    services = dgd["spec"]["services"]
    kinds = {s["componentType"] for s in services.values()}
    assert kinds == {"frontend", "worker"}
    (worker,) = [s for s in services.values() if s["componentType"] == "worker"]
    assert worker["resources"]["limits"]["gpu"] == "8"
    main_c = worker["extraPodSpec"]["mainContainer"]
    assert main_c["image"] == image and main_c["command"] == ["python3", "-m", "dynamo.vllm"]
    args = main_c["args"]          # vLLM's own arguments, the model as --model
    assert args[:2] == ["--model", "meta-llama/Llama-3.1-70B"]
    assert all(a in VLLM_DOC for a in args if a.startswith("--"))


def test_amd_gpu_asks_for_amd_resource(tmp_path):
    docs, _, _ = deploy(tmp_path, ["--model", "llama-3.1-8b", "--hardware", "mi300x"], "vllm", "--image", "my/rocm-vllm:1")
    assert docs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "1"}


def test_stored_row_of_a_run(tmp_path):
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    (run / "pareto.csv").write_text('"point","hardware","model","devices","weights","ttft_s"\n'
                                    '3,"h100-sxm","llama-3.1-8b",1,"fp16",0.1\n'
                                    '7,"h200","llama-3.1-8b",2,"fp8",0.05\n')
    docs, _, _ = deploy(tmp_path, ["--run", str(run), "--point", "7"], "vllm")
    check_deployment(docs, gpus=2)
    f = flags_of(container_argv(docs), "vllm")
    assert (f["--tensor-parallel-size"], f["--quantization"]) == ("2", "fp8")


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dse.study: error: ") and "Traceback" not in err
    return err


def test_bad_inputs_are_one_line(tmp_path, capsys):
    assert "--engine tgi" in one_line_error(capsys, ["deploy", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
                                                      "--engine", "tgi"])
    assert "no such run folder" in one_line_error(capsys, ["deploy", "--run", str(tmp_path / "none"), "--point", "1"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "pareto.csv").write_text('"point","hardware","model"\n0,"h100-sxm","llama-3.1-8b"\n')
    assert "--point 5" in one_line_error(capsys, ["deploy", "--run", str(run), "--point", "5"])
    assert "--point" in one_line_error(capsys, ["deploy", "--run", str(run), "--point", "-1"])
    assert "--hardware tpu-v5e" in one_line_error(capsys, ["deploy", "--model", "llama-3.1-8b", "--hardware",
                                                           "tpu-v5e", "--devices", "4"])
    assert "TensorRT-LLM runs on NVIDIA" in one_line_error(capsys, ["deploy", "--model", "llama-3.1-8b", "--hardware",
                                                                    "mi300x", "--engine", "trtllm"])
    assert "--model" in one_line_error(capsys, ["deploy", "--run", str(run), "--point", "0", "--model", "llama-2-7b"])


def test_what_an_engine_cannot_express_is_said(tmp_path):
    """int4 weights (no vLLM flag: a pre-quantized checkpoint), an int8 KV cache (not among
    --kv-cache-dtype's choices) and 256-token pages (not among --block-size's) each get a note in
    launch.sh and manifest.yaml, and no flag of theirs is written."""
    argv = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--weights", "int4", "--kv", "int8",
            "--kv-block", "256", "--concurrency", "8"]
    docs, script, _ = deploy(tmp_path, argv, "vllm")
    f = flags_of(container_argv(docs), "vllm")
    assert "--quantization" not in f and "--kv-cache-dtype" not in f and "--block-size" not in f
    manifest = next((tmp_path).glob("vllm-*/manifest.yaml")).read_text()
    for words in ("weights int4", "kv int8", "kv_block 256"):
        assert f"left out / mapped: {words}" in script and f"left out / mapped: {words}" in manifest


def test_stored_row_from_the_runs_rows(tmp_path):
    """A design off the Pareto front is read from the rows the run kept (results.parquet)."""
    import pandas as pd
    run = tmp_path / "run"
    run.mkdir()
    (run / "pareto.csv").write_text('"point","hardware","model","devices"\n0,"h100-sxm","llama-3.1-8b",1\n')
    pd.DataFrame({"point": [0, 1, 2], "hardware": ["h100-sxm"] * 3, "model": ["llama-3.1-8b"] * 3,
                  "devices": [1, 2, 4], "kv": ["fp16", "fp16", "fp8"]}).to_parquet(run / "results.parquet")
    docs, _, _ = deploy(tmp_path, ["--run", str(run), "--point", "2"], "sglang")
    check_deployment(docs, gpus=4)
    f = flags_of(container_argv(docs), "sglang")
    assert (f["--tp-size"], f["--kv-cache-dtype"]) == ("4", "fp8_e4m3")
