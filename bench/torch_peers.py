#!/usr/bin/env python3
"""PyTorch peers for bench_kernels_cuda, run in the same device call so that ratios are same-run.

Llama-3-8B attention shape (H = 32, H_kv = 8, d = 128), bf16, batch 1, one layer:
  select  einsum q.K^T -> softmax over tokens -> sum over heads -> topk(2048), all in bf16
          (the straightforward PyTorch soft vote; keys contiguous, no paging), N = 32K..1M
  sparse  K/V index_select of 2688 random slots + scaled_dot_product_attention (no RoPE)
  dense   scaled_dot_product_attention decode (1 query) over N = 128K and 1M contiguous tokens,
          cuDNN backend when available (GQA via enable_gqa), as in docs/DESIGN.md section 8
Timing: CUDA events, warm-up, median of many reps, inputs rotated so that reps read HBM.
Usage: python3 bench/torch_peers.py [--quick]
"""
import statistics
import sys

import torch
import torch.nn.functional as F

H, HKV, D = 32, 8, 128
QUICK = "--quick" in sys.argv
REPS = 10 if QUICK else 50


def median_ms(fn, reps=REPS, warmup=5):
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i)
        stops[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops))


def sdpa_backend_ctx():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                            SDPBackend.EFFICIENT_ATTENTION]), "cudnn>flash>efficient"
    except Exception:  # older torch
        import contextlib
        return contextlib.nullcontext(), "default"


def main():
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    big = 1 << 20
    keys = torch.randn(big, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    vals = torch.randn(big, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    q = (torch.randn(H, D, device=dev, generator=gen) * (3.0 / D ** 0.5)).to(torch.bfloat16)
    qg = q.view(HKV, H // HKV, D)

    for n in (32 << 10, 128 << 10, 512 << 10, 1 << 20):
        sets = max(1, min(8, big // n))
        views = [keys[s * n:(s + 1) * n] for s in range(sets)]

        def select(i):
            k = views[i % sets]
            s = torch.einsum("kgd,nkd->kgn", qg, k)          # [H_kv, g, N] bf16
            p = torch.softmax(s, dim=-1)                      # bf16
            vote = p.sum(dim=(0, 1))                          # [N]
            return torch.topk(vote, 2048).indices

        ms = median_ms(select)
        rows.append((f"torch select N={n >> 10}K einsum+softmax+sum+topk", ms, n * HKV * D * 2 / ms / 1e6))

    ctx, backend = sdpa_backend_ctx()
    with ctx:
        qd = torch.randn(1, H, 1, D, device=dev, dtype=torch.bfloat16, generator=gen)
        idx_sets = [torch.randint(0, big, (2688,), device=dev, generator=gen) for _ in range(16)]

        def sparse(i):
            idx = idx_sets[i % 16]
            k = keys.index_select(0, idx).permute(1, 0, 2).unsqueeze(0)  # [1, H_kv, n, D]
            v = vals.index_select(0, idx).permute(1, 0, 2).unsqueeze(0)
            return F.scaled_dot_product_attention(qd, k, v, enable_gqa=True)

        ms = median_ms(sparse, reps=REPS * 4)
        rows.append(("torch sparse 2688 gather+sdpa", ms, 2 * 2688 * HKV * D * 2 / ms / 1e6))
        for n in (128 << 10, 1 << 20):
            sets = max(1, min(8, big // n))
            ks = [keys[s * n:(s + 1) * n].permute(1, 0, 2).unsqueeze(0).contiguous() for s in range(sets)]
            vs = [vals[s * n:(s + 1) * n].permute(1, 0, 2).unsqueeze(0).contiguous() for s in range(sets)]

            def dense(i):
                return F.scaled_dot_product_attention(qd, ks[i % sets], vs[i % sets], enable_gqa=True)

            ms = median_ms(dense)
            rows.append((f"torch dense decode N={n >> 10}K sdpa ({backend})", ms, 2 * n * HKV * D * 2 / ms / 1e6))
            del ks, vs
            torch.cuda.empty_cache()

    print(f"\n{'case (PyTorch peers, bf16)':52s} {'ms':>10s} {'GB/s':>10s}")
    for name, ms, gbps in rows:
        print(f"{name:52s} {ms:10.4f} {gbps:10.1f}")
    print("GB/s: selection counts key bytes; decode counts K + V bytes (as bench_kernels_cuda).")


if __name__ == "__main__":
    main()
