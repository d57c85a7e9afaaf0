"""Plain functional forwards written from the parity fixtures' notes (not from RouteScope's code),
operating directly on state dicts with the reference key names. Used to check configurations for
which no fixture exists, and checked themselves against the fixtures."""
import math

import torch
import torch.nn.functional as F


# --- PaPaformer -----------------------------------------------------------------------------------

def papaformer_keys(args: dict, par: dict, variant: str) -> dict[str, tuple[int, ...]]:
    """Reference key -> shape for Decoder(args, args_paraller)."""
    d, dp, k, V = args["dim"], par["dim"], par["n_parallel_blocks"], args["vocab_size"]
    n_par = args["n_layers"] + 1

    def block(prefix, w):
        out = {f"{prefix}attention.{x}.linear.weight": (w, w) for x in "QKV"}
        out.update({f"{prefix}feedforward.beta": (1, 4 * w), f"{prefix}feedforward.linear1.weight": (4 * w, w),
                    f"{prefix}feedforward.linear2.weight": (4 * w, w), f"{prefix}feedforward.linear3.weight": (w, 4 * w),
                    f"{prefix}norm_1.weight": (w,), f"{prefix}norm_2.weight": (w,)})
        return out

    keys = {"embeddings.weight": (V, d), "norm.weight": (d,), "Linear.linear.weight": (V, d),
            "layers.0.Share.linear.weight": (dp, d)}
    keys.update(block("layers.0.block.", d))
    keys.update(block(f"layers.{n_par + 1}.block.", d))
    for i in range(1, n_par + 1):
        last = i == n_par
        for j in range(k):
            keys.update(block(f"layers.{i}.blocks.{j}.", dp))
        if variant == "share_linear":
            keys[f"layers.{i}.Share.linear.weight"] = (d if last else dp, k * dp)
        else:
            keys[f"layers.{i}.MoE.share_linear.weight"] = (dp, 2 * dp)
            keys[f"layers.{i}.MoE.share_linear.bias"] = (dp,)
            keys[f"layers.{i}.MoE.router.weight"] = (3, dp if variant == "gumbel_v1" else 2 * dp)
            keys[f"layers.{i}.MoE.router.bias"] = (3,)
            if last:
                keys[f"layers.{i}.out_linear.linear.weight"] = (d, dp)
    return keys


def _rms(x, w):
    return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5))


def _rope(x, head_dim, T):  # x: (B, T, H, hd), interleaved pairs as complex numbers
    freqs = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(T, dtype=torch.float32), freqs)
    rot = torch.polar(torch.ones_like(angles), angles)  # (T, hd/2)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * rot[None, :, None, :]).flatten(3)


def _papa_block(sd, p, x, n_heads, mask):
    B, T, w = x.shape
    hd = w // n_heads
    h = _rms(x, sd[p + "norm_1.weight"])
    q, k, v = (h @ sd[f"{p}attention.{n}.linear.weight"].T for n in "QKV")
    q, k = _rope(q.view(B, T, n_heads, hd), hd, T), _rope(k.view(B, T, n_heads, hd), hd, T)
    v = v.view(B, T, n_heads, hd)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd) + mask
    att = torch.einsum("bhqk,bkhd->bqhd", scores.float().softmax(-1), v).reshape(B, T, w)
    x = x + att
    h = _rms(x, sd[p + "norm_2.weight"])
    a = h @ sd[p + "feedforward.linear1.weight"].T
    gate = a * torch.sigmoid(sd[p + "feedforward.beta"] * a)
    return x + (h @ sd[p + "feedforward.linear2.weight"].T * gate) @ sd[p + "feedforward.linear3.weight"].T


def papaformer_forward(sd, args, par, variant, ids):
    """Logits and {'parallel.i.route': argmax routes} for deterministic routing."""
    B, T = ids.shape
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T).clone()
    mask = mask.masked_fill((ids == args["pad_id"])[:, None, None, :], float("-inf"))
    n_par = args["n_layers"] + 1
    x = sd["embeddings.weight"][ids]
    x = _papa_block(sd, "layers.0.block.", x, args["n_heads"], mask) @ sd["layers.0.Share.linear.weight"].T
    routes = {}
    for i in range(1, n_par + 1):
        outs = [_papa_block(sd, f"layers.{i}.blocks.{j}.", x, par["n_heads"], mask)
                for j in range(par["n_parallel_blocks"])]
        cat = torch.cat(outs, -1)
        if variant == "share_linear":
            x = cat @ sd[f"layers.{i}.Share.linear.weight"].T
            continue
        xs = cat @ sd[f"layers.{i}.MoE.share_linear.weight"].T + sd[f"layers.{i}.MoE.share_linear.bias"]
        r_in = xs if variant == "gumbel_v1" else cat
        logits = r_in @ sd[f"layers.{i}.MoE.router.weight"].T + sd[f"layers.{i}.MoE.router.bias"]
        route = logits.argmax(-1)
        routes[f"parallel.{i - 1}.route"] = route
        x = torch.stack(outs + [xs], -2).gather(-2, route[..., None, None].expand(B, T, 1, xs.shape[-1]))[..., 0, :]
        if i == n_par:
            x = x @ sd[f"layers.{i}.out_linear.linear.weight"].T
    x = _papa_block(sd, f"layers.{n_par + 1}.block.", x, args["n_heads"], mask)
    return (_rms(x, sd["norm.weight"]) @ sd["Linear.linear.weight"].T).float(), routes


# --- ParallelGPT -----------------------------------------------------------------------------------

def pgpt_keys(g: dict) -> dict[str, tuple[int, ...]]:
    d, V = g["n_embd"], g["vocab_size"]
    keys = {"transformer.wte.weight": (V, d), "transformer.wpe.weight": (g["block_size"], d),
            "transformer.wt": (), "transformer.ln_f.weight": (d,), "lm_head.weight": (V, d)}
    for p in (1, 2):
        keys[f"transformer.lin_{p}.weight"] = (d, d)
        keys[f"transformer.lin_{p}.bias"] = (d,)
        for b in range(g["n_layer"] // 2):
            pre = f"transformer.h_{p}.{b}."
            keys.update({pre + "ln_1.weight": (d,), pre + "ln_2.weight": (d,), pre + "attn.c_attn.weight": (3 * d, d),
                         pre + "attn.c_proj.weight": (d, d), pre + "mlp.c_fc.weight": (4 * d, d),
                         pre + "mlp.c_proj.weight": (d, 4 * d)})
    return keys


def pgpt_forward(sd, g, ids, only_path=None):
    B, T = ids.shape
    d, H = g["n_embd"], g["n_head"]
    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]
    outs = []
    for p in (1, 2):
        h = x @ sd[f"transformer.lin_{p}.weight"].T + sd[f"transformer.lin_{p}.bias"]
        for b in range(g["n_layer"] // 2):
            pre = f"transformer.h_{p}.{b}."
            a = F.layer_norm(h, (d,), sd[pre + "ln_1.weight"], None, 1e-5)
            q, k, v = (a @ sd[pre + "attn.c_attn.weight"].T).split(d, -1)
            q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
            h = h + y @ sd[pre + "attn.c_proj.weight"].T
            a = F.layer_norm(h, (d,), sd[pre + "ln_2.weight"], None, 1e-5)
            h = h + F.gelu(a @ sd[pre + "mlp.c_fc.weight"].T) @ sd[pre + "mlp.c_proj.weight"].T
        outs.append(h)
    w = torch.sigmoid(sd["transformer.wt"])
    x = outs[only_path] if only_path is not None else w * outs[0] + (1 - w) * outs[1]
    return F.layer_norm(x, (d,), sd["transformer.ln_f.weight"], None, 1e-5) @ sd["lm_head.weight"].T
