"""Tiny models a real vLLM serves on a CPU, built here from nothing (test set-up only).

Run with the real-vLLM tier's venv (vllm_venv.py), which has torch, transformers, tokenizers and
safetensors: ``VENV/bin/python vllm_models.py OUT [--bad-draft]``. Writes ``OUT/target`` (a
random Llama: hidden 128, 2 layers, 4 heads of 32, vocab 1024, float32 safetensors) and
``OUT/draft`` (an EAGLE-3 drafter for it in the HF EAGLE-3 naming: one ``midlayer``, ``fc`` over
three auxiliary layers, ``d2t``/``t2d`` over a 512-token draft vocabulary, no embeddings of its own),
sharing one byte-level BPE tokenizer trained on a text generated here. Nothing comes from a hub.

``--rejecting-draft``: ``d2t[0] = 1``, so the drafter proposes token 1 where the target picks 0:
no draft token is ever accepted (the bench tier's other end).
``--qwen2-audio``: the target is a tiny Qwen2AudioForConditionalGeneration instead (a wrapper that
lacks vLLM's EAGLE-3 interface while its Qwen2 text model has it), the drafter sized for its vocabulary.
``--bad-draft``: the drafter's ``fc`` is the wrong shape for the target, so vLLM's drafter load
fails (the tier's real crash). The target's final norm is zero, so greedy decoding picks token 0
whatever the input; with the draft's norm zero too and ``d2t`` zero the drafter proposes what the
target picks (every draft token accepted), which the bench tier can read back from /metrics.
This file imports nothing of provision: it runs in the venv, not in provision's interpreter.
"""

from __future__ import annotations

import json
import os
import sys

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB, DRAFT_VOCAB = 128, 256, 2, 4, 2, 32, 1024, 512
AUX_LAYERS = [0, 1, 2]


def _corpus() -> list[str]:
    words = ("the server loads weights from disk and answers requests while the drafter proposes tokens "
             "that the target verifies in one step provision starts stops and restarts engines over ssh "
             "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau").split()
    out = []
    for i in range(2000):
        out.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + f" {i}.")
    return out


def tokenizer(out: str) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(_corpus(), vocab_size=VOCAB, min_frequency=1,
                            special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    fast.save_pretrained(out)


def target(out: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB,
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                      torch_dtype="float32", tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.norm.weight.zero_()  # every logit equal: greedy picks token 0
    model.save_pretrained(out, safe_serialization=True)
    tokenizer(out)


def draft(out: str, bad: bool = False, rejecting: bool = False) -> None:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(1)
    os.makedirs(out, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
           "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
           "target_hidden_size": HIDDEN, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
           "hidden_act": "silu", "torch_dtype": "float32", "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2,
           "eagle_aux_hidden_state_layer_ids": AUX_LAYERS,
           "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": AUX_LAYERS}}
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)

    def w(*shape):
        return torch.randn(*shape) * 0.02

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    fc_in = (len(AUX_LAYERS) + (1 if bad else 0)) * HIDDEN  # --bad-draft: fc does not fit the target
    t = {"midlayer.self_attn.q_proj.weight": w(q, 2 * HIDDEN), "midlayer.self_attn.k_proj.weight": w(kv, 2 * HIDDEN),
         "midlayer.self_attn.v_proj.weight": w(kv, 2 * HIDDEN), "midlayer.self_attn.o_proj.weight": w(HIDDEN, q),
         "midlayer.mlp.gate_proj.weight": w(INTER, HIDDEN), "midlayer.mlp.up_proj.weight": w(INTER, HIDDEN),
         "midlayer.mlp.down_proj.weight": w(HIDDEN, INTER),
         "midlayer.input_layernorm.weight": torch.ones(HIDDEN), "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
         "midlayer.post_attention_layernorm.weight": torch.ones(HIDDEN),
         "norm.weight": torch.zeros(HIDDEN),  # with d2t zero: proposes token 0, what the target picks
         "fc.weight": w(HIDDEN, fc_in), "lm_head.weight": w(DRAFT_VOCAB, HIDDEN),
         # d2t[k]: draft id k is target id k + d2t[k]; --rejecting-draft: it proposes token 1, never accepted
         "d2t": torch.tensor([1 if rejecting else 0] + [0] * (DRAFT_VOCAB - 1), dtype=torch.int64),
         "t2d": torch.cat([torch.ones(DRAFT_VOCAB, dtype=torch.bool), torch.zeros(VOCAB - DRAFT_VOCAB, dtype=torch.bool)])}
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, "model.safetensors"))
    tokenizer(out)


def qwen2_audio_target(out: str) -> None:
    """A tiny Qwen2AudioForConditionalGeneration: a wrapper from the audit's list that the CPU build
    serves without torchvision (a Qwen2 text model, hidden 128, 2 layers, the final norm zero as the
    Llama target's; a 1-layer Whisper-style audio tower of d_model 64), with the tokenizer plus its
    three audio tokens and a Qwen2AudioProcessor. Saved with transformers' own classes, then the
    text model's weights renamed to the layout vLLM 0.32 loads (transformers 5 writes
    language_model.model.model.*, vLLM maps language_model.model.*)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (AutoTokenizer, Qwen2AudioConfig, Qwen2AudioForConditionalGeneration,
                              Qwen2AudioProcessor, WhisperFeatureExtractor)

    global VOCAB
    tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]})
    tok.save_pretrained(out)
    VOCAB = len(tok)  # the drafter's target vocabulary too
    torch.manual_seed(0)
    cfg = Qwen2AudioConfig(
        audio_config={"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 128,
                      "num_mel_bins": 128, "max_source_positions": 1500},
        text_config={"model_type": "qwen2", "hidden_size": HIDDEN, "intermediate_size": INTER,
                     "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
                     "vocab_size": VOCAB, "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2,
                     "tie_word_embeddings": False, "torch_dtype": "float32"},
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"))
    model = Qwen2AudioForConditionalGeneration(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("model.norm.weight") and "audio" not in name:
                p.zero_()
    model.save_pretrained(out, safe_serialization=True)
    path = os.path.join(out, "model.safetensors")
    weights = {k.replace("language_model.model.model.", "language_model.model."): v for k, v in load_file(path).items()}
    save_file(weights, path, metadata={"format": "pt"})
    Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok,
                        chat_template=tok.chat_template).save_pretrained(out)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: vllm_models.py OUT [--bad-draft | --rejecting-draft | --qwen2-audio]", file=sys.stderr)
        return 2
    out = argv[0]
    if "--qwen2-audio" in argv:
        qwen2_audio_target(os.path.join(out, "target"))
    else:
        target(os.path.join(out, "target"))
    draft(os.path.join(out, "draft"), bad="--bad-draft" in argv, rejecting="--rejecting-draft" in argv)
    print(json.dumps({"target": os.path.join(out, "target"), "draft": os.path.join(out, "draft")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
