"""A small GPT-2-shaped transformer in plain torch.nn (token and position embeddings, pre-norm
encoder layers under a causal mask, final LayerNorm, tied LM head), shared by the inference and
training clients. Random weights from the caller's seed: nothing is downloaded."""

from torch import nn
import torch


class TinyGPT(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2

    def forward(self, tokens):
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        x = self.tok(tokens) + self.pos(torch.arange(n, device=tokens.device))
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.ln_f(x))


def add_model_args(p, *, vocab, d_model, heads, layers, min_len, max_len):
    """The model's shape, the range of sequence lengths, the seed and the device, as options of a
    client script's parser, with that script's defaults."""
    p.add_argument("--min-len", type=int, default=min_len)
    p.add_argument("--max-len", type=int, default=max_len)
    p.add_argument("--vocab", type=int, default=vocab)
    p.add_argument("--d-model", type=int, default=d_model)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cpu only to try the script without a GPU")


def model(args):
    """The model of `add_model_args`' options (random weights from the current seed)."""
    return TinyGPT(args.vocab, args.d_model, args.heads, args.layers, args.max_len)
