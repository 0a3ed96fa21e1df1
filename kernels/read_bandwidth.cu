// The benchmark's ceiling, not part of the engine: how fast this GPU streams memory it
// only reads, the limit every decode step runs into (each step reads all the weights).
//
// Launch: any grid of blocks of any multiple of 32 threads; `words` 16-byte words at `in`.
// Each thread reads every (gridDim.x · blockDim.x)-th word, four independent loads in
// flight at a time, and folds them with XOR so the compiler must keep every load. The fold
// is written only where it equals `never`, a value the host picks so that it never does:
// nothing is stored, and the timing is reads alone.

extern "C" __global__ void read_bandwidth(const uint4* in, unsigned long long words, unsigned int never,
                                          unsigned int* out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int fold = 0;
    for (; i + 3 * stride < words; i += 4 * stride) {
        uint4 a = __ldcs(in + i);  // streaming loads: each word is read once
        uint4 b = __ldcs(in + i + stride);
        uint4 c = __ldcs(in + i + 2 * stride);
        uint4 d = __ldcs(in + i + 3 * stride);
        fold ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < words; i += stride) {
        uint4 a = __ldcs(in + i);
        fold ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (fold == never) {
        out[0] = fold;
    }
}
