// The input's per-key lists built on the device (issue 30; src/device/csr.rs, Op::BuildCsr):
// the transpose of the inverse map, each unique key's (sample, field) slots in increasing
// order, as src/device/csr.rs's build_csr builds it on the host. The order of a key's slots
// is the summation order of its gradient (segment_sum), so it must be exactly the host's.
//
// A stable LSD radix sort of the slots 0..n by their key inverse[p], CSR_BITS bits a pass
// (one pass per CSR_BITS bits of the largest key), in chunks of `chunk` consecutive
// entries: per pass, csr_count (each chunk's digit counts), the counts' prefix sums (where
// each (digit, chunk) pair's entries go: digit-major, chunk order inside a digit) and
// csr_scatter (each chunk's entries to their places in entry order). Stable passes keep
// equal keys in slot order, so the result is sorted by (key, slot). Then csr_offsets.
// One thread owns each output and walks its inputs in a fixed order: no atomics, and the
// result does not depend on the launch geometry.
#define CSR_BITS 4
#define CSR_DIGITS 16

// Entry i of a pass's input: the slot order[i] (the previous pass's output), or i itself
// in the first pass.
static __device__ __forceinline__ u32 csr_entry(const u32* order, int ordered, long long i) {
    return ordered ? order[i] : (u32)i;
}

// counts[d * chunks + c] = the entries of chunk c whose key's digit (key >> shift) % 16 is d.
extern "C" __global__ void csr_count(const u32* __restrict__ inverse, const u32* __restrict__ order, int ordered,
                                     u32* __restrict__ counts, int n, int chunks, int chunk, int shift) {
    for (long long c = RR_TID; c < chunks; c += RR_STRIDE) {
        u32 count[CSR_DIGITS];
        for (int d = 0; d < CSR_DIGITS; d++) count[d] = 0;
        long long end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (long long i = c * chunk; i < end; i++) count[(inverse[csr_entry(order, ordered, i)] >> shift) & (CSR_DIGITS - 1)]++;
        for (int d = 0; d < CSR_DIGITS; d++) counts[d * (long long)chunks + c] = count[d];
    }
}

// The exclusive prefix sums of the counts in digit-major order (counts[d * chunks + c] is
// entry d * chunks + c of a list of len = 16 * chunks), in blocks of CSR_SCAN entries so no
// thread walks more than CSR_SCAN entries or len / CSR_SCAN block sums in a row:
// csr_block_sums, csr_block_starts (one thread), csr_starts.
#define CSR_SCAN 64

// sums[b] = the counts of block b summed.
extern "C" __global__ void csr_block_sums(const u32* __restrict__ counts, u32* __restrict__ sums, int len) {
    for (long long b = RR_TID; b * CSR_SCAN < len; b += RR_STRIDE) {
        u32 s = 0;
        long long end = (b + 1) * CSR_SCAN < len ? (b + 1) * CSR_SCAN : len;
        for (long long i = b * CSR_SCAN; i < end; i++) s += counts[i];
        sums[b] = s;
    }
}

// block_starts[b] = the sums of the blocks before b (one thread).
extern "C" __global__ void csr_block_starts(const u32* __restrict__ sums, u32* __restrict__ block_starts, int blocks) {
    for (long long t = RR_TID; t < 1; t += RR_STRIDE) {
        u32 at = 0;
        for (long long b = 0; b < blocks; b++) {
            block_starts[b] = at;
            at += sums[b];
        }
    }
}

// starts[i] = the counts before entry i: its block's start, then the block's entries before it.
extern "C" __global__ void csr_starts(const u32* __restrict__ counts, const u32* __restrict__ block_starts,
                                      u32* __restrict__ starts, int len) {
    for (long long b = RR_TID; b * CSR_SCAN < len; b += RR_STRIDE) {
        u32 at = block_starts[b];
        long long end = (b + 1) * CSR_SCAN < len ? (b + 1) * CSR_SCAN : len;
        for (long long i = b * CSR_SCAN; i < end; i++) {
            starts[i] = at;
            at += counts[i];
        }
    }
}

// out[...] = each entry of chunk c, in entry order, at its digit's next place from starts.
extern "C" __global__ void csr_scatter(const u32* __restrict__ inverse, const u32* __restrict__ order, int ordered,
                                       const u32* __restrict__ starts, u32* __restrict__ out, int n, int chunks, int chunk,
                                       int shift) {
    for (long long c = RR_TID; c < chunks; c += RR_STRIDE) {
        u32 next[CSR_DIGITS];
        for (int d = 0; d < CSR_DIGITS; d++) next[d] = starts[d * (long long)chunks + c];
        long long end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (long long i = c * chunk; i < end; i++) {
            u32 p = csr_entry(order, ordered, i);
            out[next[(inverse[p] >> shift) & (CSR_DIGITS - 1)]++] = p;
        }
    }
}

// offsets[u] for u <= keys from the sorted slots: the first sorted position whose key is at
// least u (n past the last). Position i (0 <= i <= n) writes the keys between the one
// before it (exclusive) and its own (inclusive), so every offset has one writer.
extern "C" __global__ void csr_offsets(const u32* __restrict__ inverse, const u32* __restrict__ slots,
                                       u32* __restrict__ offsets, int n, int keys) {
    for (long long i = RR_TID; i <= n; i += RR_STRIDE) {
        long long lo = i == 0 ? 0 : (long long)inverse[slots[i - 1]] + 1;
        long long hi = i == n ? keys : (long long)inverse[slots[i]];
        for (long long u = lo; u <= hi; u++) offsets[u] = (u32)i;
    }
}
