"""One prompt's forward at several lengths, on the model itself (transformers' modules: MKL's products, SDPA) and
on the ``panel`` kernel's copy of it (its panel products and packed attention), both eager over a StaticCache of the
kernel's capacity bucket for that length, alternated, 3 times each (medians). Random token ids; the largest
difference of the last logits between the two is printed beside (the order of their sums differs).

    .venv/bin/python studies/prompt/prompt_lengths.py                      (alone on the machine)
"""

from __future__ import annotations

import statistics
import time
import warnings


def main() -> None:
    warnings.filterwarnings("ignore")
    import torch
    from transformers import StaticCache

    torch.set_num_threads(2)
    from skipsearch.kernels import graphs
    from skipsearch.kernels.panel import shared_copy
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    models = {"the model itself": sm.hf, "the kernel's copy": shared_copy(sm.hf, panels=True)}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for T in (16, 64, 300, 1000, 3000):
            capacity = graphs.bucket(T + 8)
            cache = StaticCache(config=sm.hf.config, max_cache_len=capacity)
            ids = torch.randint(0, sm.hf.config.vocab_size, (1, T), generator=g)
            seconds, last = {k: [] for k in models}, {}
            for _ in range(3):
                for name, m in models.items():
                    cache.reset()
                    t = time.perf_counter()
                    out = m(input_ids=ids, position_ids=torch.arange(T)[None], cache_position=torch.arange(T),
                            past_key_values=cache, use_cache=True, logits_to_keep=1)
                    seconds[name].append(time.perf_counter() - t)
                    last[name] = out.logits[0, -1]
            a, b = (statistics.median(v) for v in seconds.values())
            diff = float((last["the kernel's copy"] - last["the model itself"]).abs().max())
            print(f"{T:5d} tokens, cache {capacity}: the model itself {a * 1e3:7.1f} ms "
                  f"({a / T * 1e3:.2f} a token), the kernel's copy {b * 1e3:7.1f} ms ({b / T * 1e3:.2f}); "
                  f"copy / model {b / a:.2f}; largest logit difference {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
