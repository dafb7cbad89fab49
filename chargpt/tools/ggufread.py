"""Read a GGUF file that `chargpt export --format gguf` wrote, and compute with it as llama.cpp does, in numpy.

    meta, tensors = read_gguf("shakespeare.gguf")      # metadata {key: value}, tensors {name: float32 array}
    logits = forward(meta, tensors, ids)                # (T, n_vocab), llama.cpp's `gpt2` graph
    ids = tokenize(meta, "ROMEO:")                      # llama.cpp's BPE on this vocabulary

The export checks the file it wrote with these before it appears, and the tests check them against chargpt. The
forward follows llama.cpp's src/models/gpt2.cpp: token and position rows, then per layer LayerNorm -> fused q, k, v
(attn_qkv) -> causal attention scaled by 1/sqrt(head size) -> attn_output -> residual -> LayerNorm -> ffn_up ->
GELU -> ffn_down -> residual; a final LayerNorm and `output`. llama.cpp's GELU (ggml_gelu) is the tanh
approximation, and on a CPU it is looked up in a float16 table (the input rounded to float16, the result a float16):
`gelu="ggml"` computes that, `gelu="erf"` chargpt's exact GELU. Weights come back as llama.cpp reads them: f16
and q8_0 dequantized to float32. The key/value cache is kept in float32 here (llama.cpp's default is f16).
"""

import numpy as np

SQRT_2_OVER_PI = 0.7978845608028654
GELU_COEF_A = 0.044715


def read_gguf(path):
    """-> (metadata {key: python value}, tensors {name: float32 array in numpy order, rows last index first})."""
    from gguf import GGUFReader, GGUFValueType
    from gguf.quants import dequantize
    reader = GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        kind = field.types[0] if field.types else None
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                meta[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                meta[key] = [field.parts[i].tolist()[0] for i in field.data]
        elif kind == GGUFValueType.STRING:
            meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            meta[key] = field.parts[field.data[0]].tolist()[0]
    tensors, types = {}, {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # ggml's ne is innermost first
        tensors[t.name] = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        types[t.name] = t.tensor_type.name
    meta["tensor_types"] = types
    return meta, tensors


def gelu_ggml(x):
    """ggml_gelu on a CPU: tanh-approximation GELU from a float16 table (ggml-cpu/vec.h, GGML_GELU_FP16)."""
    h = x.astype(np.float16).astype(np.float32)
    y = 0.5 * h * (1.0 + np.tanh(SQRT_2_OVER_PI * h * (1.0 + GELU_COEF_A * h * h)))
    y = y.astype(np.float16).astype(np.float32)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y)).astype(np.float32)


def gelu_erf(x):
    """torch's nn.GELU(): x * Phi(x), exact."""
    from math import erf, sqrt
    return (0.5 * x * (1.0 + np.vectorize(erf, otypes=[np.float64])(x / sqrt(2.0)))).astype(np.float32)


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def forward(meta, tensors, ids, gelu="ggml"):
    """ids (T,) at positions 0 .. T-1 -> logits (T, n_vocab) float32, as llama.cpp's gpt2 graph computes them."""
    arch = meta["general.architecture"]
    n_head, eps = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.layer_norm_epsilon"]
    act = gelu_ggml if gelu == "ggml" else gelu_erf
    ids = np.asarray(ids)
    T = len(ids)
    x = tensors["token_embd.weight"][ids] + tensors["position_embd.weight"][:T]  # (T, C)
    C = x.shape[1]
    hs = C // n_head
    causal = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)
    for i in range(meta[f"{arch}.block_count"]):
        w = {k[len(f"blk.{i}."):]: v for k, v in tensors.items() if k.startswith(f"blk.{i}.")}
        h = layer_norm(x, w["attn_norm.weight"], w["attn_norm.bias"], eps)
        qkv = h @ w["attn_qkv.weight"].T + w["attn_qkv.bias"]  # (T, 3C): q, k, v, each heads side by side
        q, k, v = (qkv[:, j * C:(j + 1) * C].reshape(T, n_head, hs).transpose(1, 0, 2) for j in range(3))
        att = q @ k.transpose(0, 2, 1) / np.sqrt(hs) + causal  # (nh, T, T)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ w["attn_output.weight"].T + w["attn_output.bias"]
        h = layer_norm(x, w["ffn_norm.weight"], w["ffn_norm.bias"], eps)
        u = act((h @ w["ffn_up.weight"].T + w["ffn_up.bias"]).astype(np.float32))
        x = x + u @ w["ffn_down.weight"].T + w["ffn_down.bias"]
    h = layer_norm(x, tensors["output_norm.weight"], tensors["output_norm.bias"], eps)
    out = tensors.get("output.weight", tensors["token_embd.weight"])  # llama.cpp: the embedding when absent
    return (h @ out.T).astype(np.float32)


def byte_level(text):
    """GPT-2's byte-level alphabet (bytes_to_unicode): each UTF-8 byte of text as one printable character."""
    return "".join(BYTE_SYMBOLS[b] for b in text.encode("utf-8"))


def _byte_symbols():
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols


BYTE_SYMBOLS = _byte_symbols()


def tokenize(meta, text):
    """llama.cpp's BPE tokenizer (tokenizer.ggml.model gpt2) on this file's vocabulary -> ids. Every merge of these
    files joins the bytes of one character, so the pre-tokenizer's split into words changes nothing and is left out;
    a symbol that is no token is dropped, as llama.cpp drops it."""
    token_id = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(meta["tokenizer.ggml.merges"])}
    symbols = list(byte_level(text))
    while True:
        pairs = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
        if not pairs:
            break
        _, i = min(pairs)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return [token_id[s] for s in symbols if s in token_id]
