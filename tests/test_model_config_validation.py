"""workloads/model.py as a validation layer for Hugging Face config.json files: every
shipped config reads as before, and every bad input ends in one DseError line naming the
file and the key (never another exception, never a silently wrong number)."""
import json
from pathlib import Path

import pytest
from conftest import run_cli

import basis.files as files
from basis.errors import DseError
from workloads.model import MAX_SIZE, MODELS_DIR, available_models, load_model, spec_from_config

# ---------------------------------------------------------------------------------------------
# Every shipped config still gives the same ModelSpec (values recorded before the validation
# layer was added).

FIELDS = ("hidden_size num_layers num_heads num_kv_heads head_dim intermediate_size vocab_size num_experts "
          "experts_per_token moe_intermediate_size num_shared_experts first_dense_layers q_lora_rank kv_lora_rank "
          "qk_nope_head_dim qk_rope_head_dim v_head_dim max_position_embeddings position_embeddings").split()
SHIPPED = {
    "bloom-176b": (14336, 70, 112, 112, 128, 57344, 250880, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "deepseek-r1": (7168, 61, 128, 128, 192, 18432, 129280, 256, 8, 2048, 1, 3, 1536, 512, 128, 64, 128, 163840, 0),
    "deepseek-v3": (7168, 61, 128, 128, 192, 18432, 129280, 256, 8, 2048, 1, 3, 1536, 512, 128, 64, 128, 163840, 0),
    "falcon-180b": (14848, 80, 232, 8, 64, 59392, 65024, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "gpt-j-6b": (4096, 28, 16, 16, 256, 16384, 50400, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2048, 0),
    "llama-2-13b": (5120, 40, 40, 40, 128, 13824, 32000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4096, 0),
    "llama-2-70b": (8192, 80, 64, 8, 128, 28672, 32000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4096, 0),
    "llama-2-7b": (4096, 32, 32, 32, 128, 11008, 32000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4096, 0),
    "llama-3-70b": (8192, 80, 64, 8, 128, 28672, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8192, 0),
    "llama-3.1-405b": (16384, 126, 128, 8, 128, 53248, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072, 0),
    "llama-3.1-70b": (8192, 80, 64, 8, 128, 28672, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072, 0),
    "llama-3.1-8b": (4096, 32, 32, 8, 128, 14336, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072, 0),
    "llama-3.3-70b": (8192, 80, 64, 8, 128, 28672, 128256, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072, 0),
    "mistral-7b": (4096, 32, 32, 8, 128, 14336, 32000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32768, 0),
    "mixtral-8x7b": (4096, 32, 32, 8, 128, 14336, 32000, 8, 2, 14336, 0, 0, 0, 0, 0, 0, 0, 32768, 0),
    "opt-175b": (12288, 96, 96, 96, 128, 49152, 50272, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2048, 2050),
    "opt-30b": (7168, 48, 56, 56, 128, 28672, 50272, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2048, 2050),
    "opt-6.7b": (4096, 32, 32, 32, 128, 16384, 50272, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2048, 2050),
    "qwen2.5-72b": (8192, 80, 64, 8, 128, 29568, 152064, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 131072, 0),
}


def shipped(name: str) -> dict:
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


def test_shipped_list_is_covered():
    # the configs shipped with the newer families are checked in tests/test_model_families.py
    assert set(SHIPPED) <= set(available_models())


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_config_reads_as_before(name, tmp_path):
    m = load_model(name)
    assert tuple(getattr(m, f) for f in FIELDS) == SHIPPED[name]
    # the same file given by path (a folder holding config.json) gives the same spec
    p = tmp_path / name / "config.json"
    p.parent.mkdir()
    p.write_bytes((MODELS_DIR / f"{name}.json").read_bytes())
    for arg in (str(p), str(p.parent), p):
        assert load_model(arg) == m.__class__(**{**m.__dict__, "source": str(p)})


# ---------------------------------------------------------------------------------------------
# Writing a config: json.dumps writes float('nan') / float('inf') as the NaN / Infinity literals
# Python's reader accepts; RAW puts a number text (1e400) in verbatim.

class Raw(str):
    pass


def write(path: Path, cfg) -> Path:
    raws = {}

    def sub(v):
        if isinstance(v, Raw):
            raws[tag := f"__raw{len(raws)}__"] = str(v)
            return tag
        return v
    text = json.dumps({k: sub(v) for k, v in cfg.items()} if isinstance(cfg, dict) else cfg)
    for tag, raw in raws.items():
        text = text.replace(f'"{tag}"', raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def assert_one_line(err: DseError, path, *needles: str) -> str:
    msg = str(err)
    assert "\n" not in msg and "\r" not in msg, msg
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def mutated(base: str, **changes) -> dict:
    cfg = shipped(base)
    for k, v in changes.items():
        if v is DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


DELETE = object()
NAN, INF = float("nan"), float("inf")

# (id, base config, changes, key the message must name, words it must hold)
BAD = [
    ("head_dim negative", "llama-2-7b", {"head_dim": -128}, "head_dim", "got -128"),
    ("head_dim zero", "llama-2-7b", {"head_dim": 0}, "head_dim", "got 0"),
    ("head_dim fraction", "llama-2-7b", {"head_dim": 127.5}, "head_dim", "not a whole number"),
    ("hidden fraction", "llama-2-7b", {"hidden_size": 4096.5}, "hidden_size", "expected an integer"),
    ("hidden string", "llama-2-7b", {"hidden_size": "4096"}, "hidden_size", "expected an integer"),
    ("hidden bool", "llama-2-7b", {"hidden_size": True}, "hidden_size", "expected an integer"),
    ("hidden null", "llama-2-7b", {"hidden_size": None}, "hidden_size", "got null"),
    ("hidden missing", "llama-2-7b", {"hidden_size": DELETE}, "hidden_size", "missing 'hidden_size'"),
    ("hidden NaN", "llama-2-7b", {"hidden_size": NAN}, "hidden_size", "NaN"),
    ("hidden Infinity", "llama-2-7b", {"hidden_size": INF}, "hidden_size", "Infinity"),
    ("hidden -Infinity", "llama-2-7b", {"hidden_size": -INF}, "hidden_size", "-Infinity"),
    ("hidden 1e400", "llama-2-7b", {"hidden_size": Raw("1e400")}, "hidden_size", "1e400"),
    ("hidden 10**30", "llama-2-7b", {"hidden_size": 10 ** 30}, "hidden_size", "2**40"),
    ("hidden list", "llama-2-7b", {"hidden_size": [4096]}, "hidden_size", "a list"),
    ("layers zero", "llama-2-7b", {"num_hidden_layers": 0}, "num_hidden_layers", "from 1 to"),
    ("layers negative", "llama-2-7b", {"num_hidden_layers": -32}, "num_hidden_layers", "got -32"),
    ("vocab object", "llama-2-7b", {"vocab_size": {"n": 32000}}, "vocab_size", "an object"),
    ("intermediate negative", "llama-2-7b", {"intermediate_size": -1}, "intermediate_size", "got -1"),
    ("intermediate string", "llama-2-7b", {"intermediate_size": "11008"}, "intermediate_size", "expected an integer"),
    ("max positions fraction", "llama-2-7b", {"max_position_embeddings": 4096.5}, "max_position_embeddings",
     "whole number"),
    ("max positions zero", "llama-2-7b", {"max_position_embeddings": 0}, "max_position_embeddings", "got 0"),
    # heads
    ("heads not dividing hidden", "llama-2-7b", {"num_attention_heads": 30, "num_key_value_heads": 30},
     "num_attention_heads", "hidden_size (4096) is not a multiple of num_attention_heads (30); give head_dim"),
    ("heads above hidden", "llama-2-7b", {"num_attention_heads": 8192, "num_key_value_heads": 8192},
     "num_attention_heads", "not a multiple"),
    ("kv heads not dividing", "llama-2-7b", {"num_key_value_heads": 5}, "num_key_value_heads",
     "num_attention_heads (32)"),
    ("kv heads above heads", "llama-2-7b", {"num_key_value_heads": 64}, "num_key_value_heads",
     "from 1 to 32 (num_attention_heads)"),
    ("kv heads zero", "llama-2-70b", {"num_key_value_heads": 0}, "num_key_value_heads", "got 0"),
    # booleans and strings
    ("tie string false", "llama-2-7b", {"tie_word_embeddings": "false"}, "tie_word_embeddings", "true or false"),
    ("attention_bias 2", "llama-2-7b", {"attention_bias": 2}, "attention_bias", "true or false"),
    ("mlp_bias string", "llama-2-7b", {"mlp_bias": "no"}, "mlp_bias", "true or false"),
    ("model_type number", "llama-2-7b", {"model_type": 7}, "model_type", "expected a string"),
    ("hidden_act list", "llama-2-7b", {"hidden_act": ["silu"]}, "hidden_act", "expected a string"),
    # MoE (Mixtral)
    ("top-k zero", "mixtral-8x7b", {"num_experts_per_tok": 0}, "num_experts_per_tok", "num_local_experts"),
    ("top-10 of 8", "mixtral-8x7b", {"num_experts_per_tok": 10}, "num_experts_per_tok",
     "above num_local_experts (8)"),
    ("experts zero", "mixtral-8x7b", {"num_local_experts": 0}, "num_local_experts", "got 0"),
    ("experts missing", "mixtral-8x7b", {"num_local_experts": DELETE}, "num_local_experts", "missing"),
    ("top-k missing", "mixtral-8x7b", {"num_experts_per_tok": DELETE}, "num_experts_per_tok", "missing"),
    ("top-k fraction", "mixtral-8x7b", {"num_experts_per_tok": 1.5}, "num_experts_per_tok", "whole number"),
    # MoE (DeepSeek)
    ("routed experts zero", "deepseek-v3", {"n_routed_experts": 0}, "n_routed_experts", "got 0"),
    ("deepseek top-k above experts", "deepseek-v3", {"num_experts_per_tok": 257}, "num_experts_per_tok",
     "n_routed_experts"),
    ("shared experts negative", "deepseek-v3", {"n_shared_experts": -1}, "n_shared_experts", "from 0 to"),
    ("first dense above layers", "deepseek-v3", {"first_k_dense_replace": 62}, "first_k_dense_replace",
     "from 0 to 61 (num_hidden_layers)"),
    ("first dense negative", "deepseek-v3", {"first_k_dense_replace": -1}, "first_k_dense_replace", "got -1"),
    ("moe intermediate zero", "deepseek-v3", {"moe_intermediate_size": 0}, "moe_intermediate_size", "got 0"),
    ("moe layer freq 2", "deepseek-v3", {"moe_layer_freq": 2}, "moe_layer_freq", "only 1"),
    ("moe layer freq zero", "deepseek-v3", {"moe_layer_freq": 0}, "moe_layer_freq", "got 0"),
    # MLA
    ("kv_lora_rank negative", "deepseek-v3", {"kv_lora_rank": -1}, "kv_lora_rank", "got -1"),
    ("kv_lora_rank zero", "deepseek-v3", {"kv_lora_rank": 0}, "kv_lora_rank", "got 0"),
    ("q_lora_rank negative", "deepseek-v3", {"q_lora_rank": -5}, "q_lora_rank", "from 0 to"),
    ("rope dim zero", "deepseek-v3", {"qk_rope_head_dim": 0}, "qk_rope_head_dim", "got 0"),
    ("nope dim missing", "deepseek-v3", {"qk_nope_head_dim": DELETE}, "qk_nope_head_dim", "missing"),
    ("v dim string", "deepseek-v3", {"v_head_dim": "128"}, "v_head_dim", "expected an integer"),
    # other families
    ("gptj n_inner negative", "gpt-j-6b", {"n_inner": -1}, "n_inner", "got -1"),
    ("gptj n_embd string", "gpt-j-6b", {"n_embd": "4096"}, "n_embd", "expected an integer"),
    ("gptj n_positions NaN", "gpt-j-6b", {"n_positions": NAN}, "n_positions", "NaN"),
    ("falcon kv heads not dividing", "falcon-180b", {"num_kv_heads": 7}, "num_kv_heads", "232"),
    ("falcon ffn fraction", "falcon-180b", {"ffn_hidden_size": 0.5}, "ffn_hidden_size", "whole number"),
    ("falcon ln count 3", "falcon-180b", {"num_ln_in_parallel_attn": 3}, "num_ln_in_parallel_attn", "from 1 to 2"),
    ("falcon new arch string", "falcon-180b", {"new_decoder_architecture": "true"}, "new_decoder_architecture",
     "true or false"),
    ("opt ffn_dim missing", "opt-6.7b", {"ffn_dim": DELETE}, "ffn_dim", "missing 'ffn_dim'"),
    ("opt positions missing", "opt-6.7b", {"max_position_embeddings": DELETE}, "max_position_embeddings",
     "missing"),
    ("opt proj dim other", "opt-6.7b", {"word_embed_proj_dim": 512}, "word_embed_proj_dim", "hidden_size (4096)"),
    ("opt proj dim negative", "opt-6.7b", {"word_embed_proj_dim": -4096}, "word_embed_proj_dim", "got -4096"),
    ("opt enable_bias string", "opt-6.7b", {"enable_bias": "false"}, "enable_bias", "true or false"),
    ("bloom n_head zero", "bloom-176b", {"n_head": 0}, "n_head", "got 0"),
    ("bloom head_dim huge", "bloom-176b", {"head_dim": 2 ** 41}, "head_dim", "2**40"),
    # NaN anywhere in the file is not JSON, even in a field the model does not read
    ("NaN in unread field", "llama-2-7b", {"rms_norm_eps": NAN}, "rms_norm_eps", "NaN"),
]


@pytest.mark.parametrize("base,changes,key,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_is_one_dse_error_line(base, changes, key, words, tmp_path):
    p = write(tmp_path / "bad" / "config.json", mutated(base, **changes))
    with pytest.raises(DseError) as e:
        load_model(str(p))
    assert_one_line(e.value, p, f": {key}: ", words)


def test_spec_from_config_checks_a_dict_too():
    cfg = mutated("llama-2-7b", head_dim=float("nan"))
    with pytest.raises(DseError, match=r"^config\.json: head_dim: got NaN"):
        spec_from_config(cfg, "x")
    with pytest.raises(DseError, match=r"^my\.json: \(top level\): got \[1\] \(a list\); expected a JSON object"):
        spec_from_config([1], "x", "my.json")


# ---------------------------------------------------------------------------------------------
# Legal configs near the edges are accepted with the right numbers.

def test_explicit_head_dim_need_not_match_hidden():
    # Gemma-like: heads * head_dim != hidden_size is legal when head_dim is given
    m = spec_from_config(mutated("llama-2-7b", num_attention_heads=8, num_key_value_heads=1, head_dim=256), "g")
    assert (m.head_dim, m.num_heads, m.num_kv_heads) == (256, 8, 1)
    assert m.kv_elems_per_token_per_layer == 2 * 256


def test_legal_edges_accepted():
    assert spec_from_config(mutated("llama-2-7b", hidden_size=4096.0), "x").hidden_size == 4096
    m = spec_from_config(mutated("llama-2-7b", tie_word_embeddings=1, attention_bias=0, head_dim=None), "x")
    assert m.tie_word_embeddings is True and m.attention_bias is False and m.head_dim == 128
    m = spec_from_config(mutated("mixtral-8x7b", num_experts_per_tok=8), "x")
    assert m.experts_per_token == m.num_experts == 8
    m = spec_from_config(mutated("deepseek-v3", q_lora_rank=None, n_shared_experts=0, first_k_dense_replace=61), "x")
    assert (m.q_lora_rank, m.num_shared_experts, m.num_moe_layers) == (0, 0, 0)
    assert spec_from_config(mutated("deepseek-v3", q_lora_rank=0), "x").q_lora_rank == 0
    assert spec_from_config(mutated("gpt-j-6b", n_inner=None), "x").intermediate_size == 4 * 4096
    assert spec_from_config(mutated("llama-2-7b", hidden_size=MAX_SIZE, num_attention_heads=1,
                                    num_key_value_heads=1), "x").hidden_size == 2 ** 40


# ---------------------------------------------------------------------------------------------
# Files that are not a config.json.

def test_bad_files(tmp_path, monkeypatch):
    cases = {
        "binary.json": (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text"),
        "latin1.json": ('{"model_type": "llam\xe4"}'.encode("latin-1"), "not UTF-8 text"),
        "empty.json": (b"", "invalid JSON at line 1 column 1"),
        "truncated.json": (b'{"hidden_size": 4096,', "invalid JSON"),
        "list.json": (b"[1, 2]", "(top level): got [1, 2] (a list)"),
        "number.json": (b"42", "(top level): got 42"),
        "string.json": (b'"llama"', "(top level): got a string of 5 characters"),
        "null.json": (b"null", "(top level): got null"),
        "nan.json": (b"NaN", "(top level): got NaN"),
        "duplicate.json": (b'{"hidden_size": 4096, "hidden_size": -1}', "hidden_size: appears more than once"),
        "deep.json": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        "digits.json": (b'{"hidden_size": ' + b"9" * 5000 + b"}", "4300 digits"),
        "nested_inf.json": (b'{"rope_scaling": {"factor": [1, Infinity]}}', "rope_scaling.factor[1]: got Infinity"),
        "newline\nname.json": (b"[]", "newline\\nname.json"),
    }
    for name, (data, words) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(DseError) as e:
            load_model(str(p))
        msg = str(e.value)
        assert "\n" not in msg and words in msg, (name, msg)
    # a folder without config.json, a missing file, and a file that cannot be read
    (tmp_path / "empty_dir").mkdir()
    for arg in (tmp_path / "empty_dir", tmp_path / "missing.json", tmp_path / "nowhere" / "config.json"):
        with pytest.raises(DseError, match="model config file not found"):
            load_model(str(arg))
    p = write(tmp_path / "ok" / "config.json", shipped("llama-2-7b"))

    def denied(*_):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(files.os, "open", denied)
    with pytest.raises(DseError, match=r"cannot read the model config \(config\.json\): Permission denied"):
        load_model(str(p))


def test_bad_names():
    for arg, words in ((7, "model: got 7; expected a model name"), (None, "model: got null"),
                       ("x" * 5000, "cannot open model config"), ("llama-9\n", "unknown model 'llama-9\\n'")):
        with pytest.raises(DseError) as e:
            load_model(arg)
        assert "\n" not in str(e.value) and words in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------
# Fuzz: every field the reader takes from a shipped config, set to each bad value, must end in a
# DseError naming the file and that key. Counts are reported on failure.

COMMON_INT = ["hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads", "n_head",
              "vocab_size", "max_position_embeddings", "n_positions", "head_dim"]
INT_BY_FAMILY = {
    "gptj": ["n_inner"],
    "falcon": ["ffn_hidden_size", "num_kv_heads", "num_ln_in_parallel_attn"],
    "opt": ["ffn_dim", "word_embed_proj_dim"],
    "bloom": [],
    "llama": ["intermediate_size", "num_key_value_heads", "num_local_experts", "num_experts_per_tok",
              "n_routed_experts", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
              "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"],
}
BOOL_BY_FAMILY = {
    "gptj": [], "bloom": [],
    "falcon": ["new_decoder_architecture", "bias", "parallel_attn"],
    "opt": ["enable_bias", "do_layer_norm_before"],
    "llama": ["attention_bias", "mlp_bias"],
}
STR_BY_FAMILY = {"gptj": ["activation_function"], "opt": ["activation_function"], "falcon": [], "bloom": [],
                 "llama": ["hidden_act"]}
ZERO_OK = {"n_shared_experts", "first_k_dense_replace", "q_lora_rank"}
NULL_OK = {"max_position_embeddings", "n_positions", "head_dim", "n_inner", "ffn_hidden_size", "num_kv_heads",
           "num_ln_in_parallel_attn", "word_embed_proj_dim", "num_key_value_heads", "n_shared_experts",
           "first_k_dense_replace", "moe_layer_freq", "kv_lora_rank", "q_lora_rank"}


def family(cfg: dict) -> str:
    mt = cfg.get("model_type", "llama")
    return mt if mt in INT_BY_FAMILY else "llama"


def bad_ints(key: str, value, mt: str) -> list:
    v = value if isinstance(value, int) else 64
    out = [-1, -v, 1.5, v + 0.5, -0.5, "x", str(v), True, False, [v], {"v": v}, NAN, INF, -INF, Raw("1e400"),
           10 ** 30, MAX_SIZE + 1, 1e30]
    if key not in ZERO_OK:
        out.append(0)
    if key not in NULL_OK or (mt == "opt" and key == "max_position_embeddings"):
        out += [None, DELETE]
    return out


BAD_BOOLS = ["false", "true", "yes", 2, -1, 0.5, 1.0, [], {}, NAN]
BAD_STRS = [1, 2.5, True, [], {}, NAN]


def fuzz_cases(name: str) -> list:
    cfg = shipped(name)
    fam = family(cfg)
    cases = []
    for key in COMMON_INT + INT_BY_FAMILY[fam]:
        if key in cfg or key == "head_dim":
            cases += [(key, v) for v in bad_ints(key, cfg.get(key), fam)]
    for key in ["tie_word_embeddings"] + BOOL_BY_FAMILY[fam]:
        cases += [(key, v) for v in BAD_BOOLS]
    for key in ["model_type"] + STR_BY_FAMILY[fam]:
        cases += [(key, v) for v in BAD_STRS]
    return cases


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_fuzz_every_read_field(name, tmp_path):
    cases = fuzz_cases(name)
    escaped, accepted, unclear = [], [], []
    for i, (key, v) in enumerate(cases):
        p = write(tmp_path / f"{i}" / "config.json", mutated(name, **{key: v}))
        try:
            m = load_model(str(p))
        except DseError as e:
            msg = str(e)
            if "\n" in msg or str(p) not in msg or key not in msg:
                unclear.append((key, v, msg))
        except Exception as e:  # noqa: BLE001 - the point of the test
            escaped.append((key, v, f"{type(e).__name__}: {e}"))
        else:
            accepted.append((key, v, m))
    assert not escaped and not accepted and not unclear, (
        f"{name}: {len(cases)} bad inputs; {len(escaped)} raised another exception {escaped[:5]}; "
        f"{len(accepted)} accepted {accepted[:5]}; {len(unclear)} unclear messages {unclear[:5]}")
    assert len(cases) >= 100


def test_fuzz_size():
    total = sum(len(fuzz_cases(n)) for n in SHIPPED)
    assert total > 3000, total


# ---------------------------------------------------------------------------------------------
# The command line: exit 2, one line, no traceback.

@pytest.mark.parametrize("kind", ["negative head_dim", "NaN literal", "binary", "top-level list"])
def test_cli_bad_config_one_line(kind, tmp_path):
    p = tmp_path / "m" / "config.json"
    if kind == "negative head_dim":
        write(p, mutated("llama-2-7b", head_dim=-128))
        words = "head_dim: got -128"
    elif kind == "NaN literal":
        write(p, mutated("mixtral-8x7b", num_experts_per_tok=NAN))
        words = "num_experts_per_tok: got NaN"
    elif kind == "binary":
        p.parent.mkdir()
        p.write_bytes(bytes(range(256)))
        words = "not UTF-8 text"
    else:
        p.parent.mkdir()
        p.write_text("[]")
        words = "(top level)"
    r = run_cli("analyze", "--model", p, "--hardware", "h100-sxm")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    line, = r.stderr.strip().splitlines()
    assert line.startswith("dse.study: error:") and str(p) in line and words in line, line
