//! `learn`: placement learned from the workload, with no application rules at all.
//!
//! Valet-Learn (Valet, SoCC '25, §3.2.2 and §4) shows that hints need not be written by
//! hand: a mini-batch k-means model over what is known when a file is opened can pick its
//! stream about as well as a hand-tuned policy. This policy does that inside the sandbox.
//! There is no list of names or extensions anywhere in it; everything it knows about a
//! file kind it learned from the files of that kind that died.
//!
//! **Features of an open** (a vector of [`DIM`] numbers):
//! - the path's tokens — split at `/ . _ -` and at digit runs, each run of digits one `#`
//!   token — hashed into [`TOKEN_BUCKETS`] buckets and L2-normalised;
//! - the last token (the extension, where there is one) hashed into [`EXT_BUCKETS`];
//! - the directory depth, log2 of the file's size at open, and the reason (create, open
//!   for writing, rename);
//! - a **predicted lifetime**: log2 of the bytes the tenant writes while such a file lives,
//!   an exponentially weighted mean per *signature* (the hash of the file name with every
//!   digit run replaced by `#`, so `000012.log` and `000013.log` share one), learned from
//!   `Deleted` events.
//!
//! **Training.** Each open's feature vector is remembered by path (a bounded map of
//! [`OPEN_FILES`] entries, oldest evicted). When the file is deleted, its observed lifetime
//! updates its kind's mean, and its vector — with that updated mean as the lifetime — is a
//! training example. (Training on the raw observation instead would split one kind into
//! clusters by how long its files happened to live, clusters no open could ever be sent
//! to, since at open time only the kind's mean is known; with the mean, training and
//! placement see the same distribution.) Examples are taken in mini-batches of [`BATCH`]
//! and applied with Sculley's mini-batch k-means (WWW '10): assign the batch to the nearest
//! centroids, then move each centroid towards each of its examples with learning rate
//! 1/count. The count is capped at [`COUNT_CAP`] so the model keeps adapting. Centroids
//! are seeded from the examples, deterministically: an example farther than
//! [`SPAWN_DISTANCE2`] from every centroid seeds a new one while fewer than k exist; once
//! k exist, an example farther from all of them than the two closest are from each other
//! merges those two and seeds the freed one (so kinds that only start dying late, like
//! long-lived tables, still get a cluster of their own).
//!
//! **Decisions.** k = min(`max_streams`, 4). Clusters map to streams 0..k in the order of
//! their centroids' lifetime (shortest-lived first); the mapping is recomputed when a
//! cluster is born and otherwise only every [`REMAP_EVERY`] batches. An open goes to the
//! stream of the nearest centroid, except that a kind stays with the cluster it last went
//! to unless another is nearer by more than [`STICKINESS`], so predictions that wobble do
//! not make streams churn. The lifetime group is the stream, so a device that places by
//! group (FDP) keeps the clusters apart as well. Before anything has died, every file goes
//! to stream 0.
//!
//! A decision costs one pass over the path's bytes (tokens, kind and file key together), a
//! table lookup, an insert into the open-file map and k sparse distances over the ~8
//! non-zero features: no allocation, no randomness, about 2,500 WebAssembly instructions
//! for a short path.

use valet_policy_sdk::{export_policy, Decision, Event, Policy, Reason, Request};

/// Buckets for path tokens.
pub const TOKEN_BUCKETS: usize = 16;
/// Buckets for the last token.
pub const EXT_BUCKETS: usize = 4;
const D_TOKENS: usize = 0;
const D_EXT: usize = D_TOKENS + TOKEN_BUCKETS;
const D_DEPTH: usize = D_EXT + EXT_BUCKETS;
const D_SIZE: usize = D_DEPTH + 1;
const D_REASON: usize = D_SIZE + 1;
const D_LIFE: usize = D_REASON + 3;
/// Dimensions of a feature vector: the features, padded with zeros to a power of two, so
/// that dense distances run four lanes at a time and sparse ones index without bounds
/// checks (`dim & (DIM - 1)`).
pub const DIM: usize = (D_LIFE + 1).next_power_of_two();

/// Weight of one unit of log2(lifetime): a 4× longer life is one unit of distance, as far
/// as a different extension. Lifetime is what placement is about, so it dominates.
const LIFE_WEIGHT: f32 = 0.5;
/// Weight of a reason's one-hot dimension.
const REASON_WEIGHT: f32 = 0.5;

/// Most clusters (and streams) the policy uses.
pub const K_MAX: usize = 4;
/// Deletes per mini-batch.
pub const BATCH: usize = 8;
/// Open files whose features are remembered.
pub const OPEN_FILES: usize = 4096;
/// Cap of a centroid's count: the smallest learning rate is 1/COUNT_CAP.
pub const COUNT_CAP: u32 = 1000;
/// Squared distance beyond which an example seeds a new centroid (while fewer than k).
pub const SPAWN_DISTANCE2: f32 = 1.0;
/// Batches between recomputations of the cluster → stream mapping.
pub const REMAP_EVERY: u32 = 16;
/// Signatures whose lifetime is remembered (direct mapped).
const SIGNATURES: usize = 1024;
/// Weight of a new lifetime observation in a signature's mean.
const EWMA_ALPHA: f32 = 1.0 / 16.0;
/// A file kind stays with the cluster it last went to unless another is nearer by more
/// than this (squared distance): predictions wobble, streams should not.
pub const STICKINESS: f32 = 0.5;

/// Streams assumed until the host says how many the device has.
const ASSUMED_STREAMS: u32 = 4;

/// A feature vector.
pub type Vector = [f32; DIM];

const FNV32_OFFSET: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

const fn fnv_step(h: u32, b: u8) -> u32 {
    (h ^ b as u32).wrapping_mul(FNV32_PRIME)
}

/// log2(x), with a linear mantissa (error < 0.09); 0 for 0.
fn log2(x: u64) -> f32 {
    if x == 0 {
        return 0.0;
    }
    let e = 63 - x.leading_zeros();
    let mantissa = if e >= 23 {
        (x >> (e - 23)) as u32
    } else {
        (x << (23 - e)) as u32
    } & 0x7f_ffff;
    e as f32 + mantissa as f32 * (1.0 / 8_388_608.0)
}

/// Fibonacci hashing: the top `bits` of `h` well mixed.
fn bucket(h: u32, mul: u32, bits: u32) -> usize {
    (h.wrapping_mul(mul) >> (32 - bits)) as usize
}

/// What one pass over a path yields.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Features {
    /// The feature vector, its lifetime dimension still 0.
    pub x: Vector,
    /// The file's kind: a hash of its name's tokens and separators, each digit run one
    /// `#`, and of the tenant.
    pub sig: u32,
    /// The file's identity: a 64-bit FNV-1a of the tenant and the path. Never 0.
    pub key: u64,
    /// The dimensions of `x` that may be non-zero.
    pub support: Support,
    /// |x|², but for the lifetime dimension.
    pub norm2: f32,
}

/// The dimensions a feature vector may have non-zero, each listed once: a distance to a
/// centroid then touches only these (about 8 of the [`DIM`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Support {
    dims: [u8; DIM],
    len: u8,
}

impl Support {
    const EMPTY: Support = Support {
        dims: [0; DIM],
        len: 0,
    };

    fn push(&mut self, dim: usize) {
        self.dims[self.len as usize] = dim as u8;
        self.len += 1;
    }

    pub fn dims(&self) -> &[u8] {
        &self.dims[..self.len as usize]
    }
}

const OTHER: u8 = 0;
const DIGIT: u8 = 1;
const SEPARATOR: u8 = 2;
const SLASH: u8 = 3;

/// The class of each byte, so the hot loop does one load instead of a chain of compares.
static CLASS: [u8; 256] = {
    let mut class = [OTHER; 256];
    let mut b = b'0';
    while b <= b'9' {
        class[b as usize] = DIGIT;
        b += 1;
    }
    class[b'.' as usize] = SEPARATOR;
    class[b'_' as usize] = SEPARATOR;
    class[b'-' as usize] = SEPARATOR;
    class[b'/' as usize] = SLASH;
    class
};

/// The features of an open of `path`: one pass over its bytes.
pub fn features(tenant: u32, path: &str, reason: Reason, size: u64) -> Features {
    const DIGITS: u32 = fnv_step(FNV32_OFFSET, b'#');
    let mut x = [0.0f32; DIM];
    let mut norm2 = 0.0f32;
    let mut key: u64 = 0xcbf2_9ce4_8422_2325 ^ tenant as u64;
    let mut token = FNV32_OFFSET;
    let mut in_token = false;
    let mut in_digits = false;
    let mut last = 0u32;
    let mut sig = FNV32_OFFSET;
    let mut depth = 0u32;
    let mut buckets = 0u32;
    // A token's bucket count goes up by one; the norm follows: (c + 1)² = c² + 2c + 1.
    let mut emit = |x: &mut Vector, sig: &mut u32, h: u32| {
        let b = bucket(h, 0x9e37_79b1, 4);
        buckets |= 1 << b;
        let v = &mut x[D_TOKENS + b];
        norm2 += 2.0 * *v + 1.0;
        *v += 1.0;
        *sig = (*sig ^ h).wrapping_mul(FNV32_PRIME);
        last = h;
    };
    for &b in path.as_bytes() {
        key = (key ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        let class = CLASS[b as usize];
        if class == OTHER {
            token = fnv_step(token, b);
            in_token = true;
            in_digits = false;
            continue;
        }
        if in_token {
            emit(&mut x, &mut sig, token);
            token = FNV32_OFFSET;
            in_token = false;
        }
        if class == DIGIT {
            if !in_digits {
                emit(&mut x, &mut sig, DIGITS);
                in_digits = true;
            }
            continue;
        }
        in_digits = false;
        if class == SLASH {
            depth += 1;
            sig = FNV32_OFFSET;
        } else {
            sig = fnv_step(sig, b);
        }
    }
    if in_token {
        emit(&mut x, &mut sig, token);
    }
    let mut support = Support::EMPTY;
    let mut x_norm2 = 0.0;
    if norm2 > 0.0 {
        let inv = 1.0 / norm2.sqrt();
        while buckets != 0 {
            let dim = D_TOKENS + buckets.trailing_zeros() as usize;
            buckets &= buckets - 1;
            x[dim] *= inv;
            support.push(dim);
        }
        let ext = D_EXT + bucket(last, 0x85eb_ca6b, 2);
        x[ext] = 1.0;
        support.push(ext);
        x_norm2 = 2.0; // the unit token vector and the extension
    }
    let depth = depth.min(16) as f32 / 16.0;
    let size = log2(size) / 32.0;
    let r = match reason {
        Reason::Create => 0,
        Reason::OpenForWrite => 1,
        Reason::Rename => 2,
    };
    x[D_DEPTH] = depth;
    x[D_SIZE] = size;
    x[D_REASON + r] = REASON_WEIGHT;
    for dim in [D_DEPTH, D_SIZE, D_REASON + r, D_LIFE] {
        support.push(dim);
    }
    Features {
        x,
        sig: sig ^ tenant.wrapping_mul(0x9e37_79b1),
        key: key.max(1),
        support,
        norm2: x_norm2 + depth * depth + size * size + REASON_WEIGHT * REASON_WEIGHT,
    }
}

/// Squared Euclidean distance, in four lanes (a quarter of the loop overhead, which is
/// most of the cost in WebAssembly).
fn distance2(a: &Vector, b: &Vector) -> f32 {
    let (mut s0, mut s1, mut s2, mut s3) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
    let mut i = 0;
    while i + 4 <= DIM {
        let d0 = a[i] - b[i];
        let d1 = a[i + 1] - b[i + 1];
        let d2 = a[i + 2] - b[i + 2];
        let d3 = a[i + 3] - b[i + 3];
        s0 += d0 * d0;
        s1 += d1 * d1;
        s2 += d2 * d2;
        s3 += d3 * d3;
        i += 4;
    }
    (s0 + s1) + (s2 + s3)
}

/// Feature vectors of open files by key: a FIFO ring of [`OPEN_FILES`] slots, the oldest
/// overwritten, with an open-addressing index (linear probing, backward-shift deletion).
pub struct OpenFiles {
    keys: Vec<u64>,
    vectors: Vec<Vector>,
    next: usize,
    /// Slot + 1 of each indexed key; 0 is empty.
    index: Vec<u32>,
}

const INDEX_SLOTS: usize = 2 * OPEN_FILES;

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles {
            keys: vec![0; OPEN_FILES],
            vectors: vec![[0.0; DIM]; OPEN_FILES],
            next: 0,
            index: vec![0; INDEX_SLOTS],
        }
    }
}

impl OpenFiles {
    fn home(key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 51) as usize & (INDEX_SLOTS - 1)
    }

    /// Position in the index of `key`.
    fn find(&self, key: u64) -> Option<usize> {
        let mut i = Self::home(key);
        loop {
            let e = self.index[i];
            if e == 0 {
                return None;
            }
            if self.keys[e as usize - 1] == key {
                return Some(i);
            }
            i = (i + 1) & (INDEX_SLOTS - 1);
        }
    }

    fn unindex(&mut self, mut hole: usize) {
        self.index[hole] = 0;
        let mut j = hole;
        loop {
            j = (j + 1) & (INDEX_SLOTS - 1);
            let e = self.index[j];
            if e == 0 {
                return;
            }
            let home = Self::home(self.keys[e as usize - 1]);
            // The entry at j may move back into the hole unless its home lies in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.index[hole] = e;
                self.index[j] = 0;
                hole = j;
            }
        }
    }

    /// Remembers `vector` for `key` (replacing what was there), evicting the oldest entry
    /// when full.
    pub fn insert(&mut self, key: u64, vector: &Vector) {
        if let Some(i) = self.find(key) {
            self.vectors[self.index[i] as usize - 1] = *vector;
            return;
        }
        let slot = self.next;
        self.next = (slot + 1) % OPEN_FILES;
        let old = self.keys[slot];
        if old != 0 {
            if let Some(i) = self.find(old) {
                self.unindex(i);
            }
        }
        self.keys[slot] = key;
        self.vectors[slot] = *vector;
        let mut i = Self::home(key);
        while self.index[i] != 0 {
            i = (i + 1) & (INDEX_SLOTS - 1);
        }
        self.index[i] = slot as u32 + 1;
    }

    /// Forgets `key` and returns its vector.
    pub fn take(&mut self, key: u64) -> Option<Vector> {
        let i = self.find(key)?;
        let slot = self.index[i] as usize - 1;
        self.unindex(i);
        self.keys[slot] = 0;
        Some(self.vectors[slot])
    }

    pub fn len(&self) -> usize {
        self.index.iter().filter(|&&e| e != 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A file kind: files whose names differ only in their digits.
#[derive(Clone, Copy, Debug)]
struct Kind {
    /// The signature (never 0; 0 marks an empty slot).
    sig: u32,
    /// Mean log2 lifetime of the kind's files that died.
    life: f32,
    /// The cluster the kind's files went to last (NO_CLUSTER before any).
    cluster: u8,
}

const NO_CLUSTER: u8 = u8::MAX;

impl Kind {
    const EMPTY: Kind = Kind {
        sig: 0,
        life: 0.0,
        cluster: NO_CLUSTER,
    };
}

/// The policy's model and memory.
pub struct Learn {
    max_streams: u32,
    /// Clusters allowed.
    k: usize,
    /// Clusters seeded so far (≤ k).
    used: usize,
    centroids: [Vector; K_MAX],
    /// Squared norm of each centroid, for sparse distances.
    norms: [f32; K_MAX],
    counts: [u32; K_MAX],
    stream_of: [u32; K_MAX],
    batch: [Vector; BATCH],
    batch_len: usize,
    batches_since_remap: u32,
    /// What is known of each file kind, direct mapped by signature.
    kinds: Vec<Kind>,
    /// Mean log2 lifetime over everything, for signatures never seen to die.
    overall: Option<f32>,
    open: OpenFiles,
}

impl Default for Learn {
    fn default() -> Self {
        let mut learn = Learn {
            max_streams: 0,
            k: 0,
            used: 0,
            centroids: [[0.0; DIM]; K_MAX],
            norms: [0.0; K_MAX],
            counts: [0; K_MAX],
            stream_of: [0; K_MAX],
            batch: [[0.0; DIM]; BATCH],
            batch_len: 0,
            batches_since_remap: 0,
            kinds: vec![Kind::EMPTY; SIGNATURES],
            overall: None,
            open: OpenFiles::default(),
        };
        learn.init(ASSUMED_STREAMS);
        learn
    }
}

impl Learn {
    /// Clusters seeded so far.
    pub fn clusters(&self) -> usize {
        self.used
    }

    /// The slot of `sig` in the kinds table, if the kind is known.
    fn kind(&self, sig: u32) -> Option<usize> {
        let sig = sig.max(1);
        let slot = sig as usize % SIGNATURES;
        (self.kinds[slot].sig == sig).then_some(slot)
    }

    fn predicted_lifetime(&self, kind: Option<usize>) -> f32 {
        match kind {
            Some(slot) => self.kinds[slot].life,
            None => self.overall.unwrap_or(0.0),
        }
    }

    fn observe_lifetime(&mut self, sig: u32, life: f32) {
        let sig = sig.max(1);
        let slot = &mut self.kinds[sig as usize % SIGNATURES];
        if slot.sig == sig {
            slot.life += EWMA_ALPHA * (life - slot.life);
        } else {
            *slot = Kind {
                sig,
                life,
                cluster: NO_CLUSTER,
            };
        }
        self.overall = Some(match self.overall {
            Some(mean) => mean + EWMA_ALPHA * (life - mean),
            None => life,
        });
    }

    fn nearest(&self, x: &Vector) -> Option<(usize, f32)> {
        let mut best: Option<(usize, f32)> = None;
        for (c, centroid) in self.centroids[..self.used].iter().enumerate() {
            let d = distance2(x, centroid);
            if best.is_none_or(|(_, b)| d < b) {
                best = Some((c, d));
            }
        }
        best
    }

    /// Squared distance from centroid `c` to `x`, touching only `x`'s support:
    /// |x|² − 2 x·c + |c|².
    fn sparse_distance2(&self, c: usize, x: &Vector, support: &Support, x_norm2: f32) -> f32 {
        let centroid = &self.centroids[c];
        let mut dot = 0.0f32;
        for &dim in support.dims() {
            let dim = dim as usize & (DIM - 1);
            dot += x[dim] * centroid[dim];
        }
        x_norm2 - 2.0 * dot + self.norms[c]
    }

    /// The cluster for a file being placed (its predicted lifetime filled in) of kind
    /// `kind`: the nearest, unless the kind's previous cluster is nearly as near.
    fn cluster_for(
        &mut self,
        x: &Vector,
        support: &Support,
        x_norm2: f32,
        kind: Option<usize>,
    ) -> Option<usize> {
        let mut best: Option<(usize, f32)> = None;
        for c in 0..self.used {
            let d = self.sparse_distance2(c, x, support, x_norm2);
            if best.is_none_or(|(_, b)| d < b) {
                best = Some((c, d));
            }
        }
        let (best, d) = best?;
        let Some(slot) = kind else {
            return Some(best);
        };
        let before = self.kinds[slot].cluster as usize;
        if before < self.used
            && before != best
            && self.sparse_distance2(before, x, support, x_norm2) <= d + STICKINESS
        {
            return Some(before);
        }
        self.kinds[slot].cluster = best as u8;
        Some(best)
    }

    fn stream_of_cluster(&self, cluster: Option<usize>) -> u32 {
        let s = cluster.map_or(0, |c| self.stream_of[c]);
        s.min(self.max_streams.saturating_sub(1))
    }

    /// Streams in order of the centroids' lifetimes, shortest first.
    fn remap(&mut self) {
        let mut order = [0usize; K_MAX];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i;
        }
        let order = &mut order[..self.used];
        // Insertion sort: stable, and k is at most 4.
        for i in 1..order.len() {
            let mut j = i;
            while j > 0 && self.centroids[order[j]][D_LIFE] < self.centroids[order[j - 1]][D_LIFE] {
                order.swap(j, j - 1);
                j -= 1;
            }
        }
        for (rank, &c) in order.iter().enumerate() {
            self.stream_of[c] = rank as u32;
        }
        self.batches_since_remap = 0;
    }

    /// Makes `x` the centroid of cluster `c` (the next unused one, or one just freed).
    fn seed(&mut self, c: usize, x: &Vector) {
        self.centroids[c] = *x;
        self.counts[c] = 1;
        self.used = self.used.max(c + 1);
        self.refresh_norm(c);
    }

    fn refresh_norm(&mut self, c: usize) {
        self.norms[c] = self.centroids[c].iter().map(|v| v * v).sum();
    }

    /// The two closest centroids and their squared distance.
    fn closest_pair(&self) -> Option<(usize, usize, f32)> {
        let mut best: Option<(usize, usize, f32)> = None;
        for p in 0..self.used {
            for q in p + 1..self.used {
                let d = distance2(&self.centroids[p], &self.centroids[q]);
                if best.is_none_or(|(_, _, b)| d < b) {
                    best = Some((p, q, d));
                }
            }
        }
        best
    }

    /// Folds cluster `q` into cluster `p` (count-weighted); `q` is then free.
    fn merge(&mut self, p: usize, q: usize) {
        let (np, nq) = (self.counts[p] as f32, self.counts[q] as f32);
        let wq = nq / (np + nq);
        let cq = self.centroids[q];
        for (m, v) in self.centroids[p].iter_mut().zip(&cq) {
            *m += wq * (v - *m);
        }
        self.counts[p] = (self.counts[p] + self.counts[q]).min(COUNT_CAP);
        self.refresh_norm(p);
    }

    /// One step of mini-batch k-means over the collected examples.
    fn train(&mut self) {
        let n = self.batch_len;
        self.batch_len = 0;
        let mut assigned = [usize::MAX; BATCH];
        let mut born = false;
        for i in 0..n {
            let x = self.batch[i];
            let Some((c, d)) = self.nearest(&x) else {
                self.seed(0, &x);
                born = true;
                continue;
            };
            if d <= SPAWN_DISTANCE2 {
                assigned[i] = c;
            } else if self.used < self.k {
                self.seed(self.used, &x);
                born = true;
            } else {
                match self.closest_pair() {
                    // Something new, farther from every cluster than the two closest
                    // clusters are from each other: merge those two, seed the new one.
                    Some((p, q, between)) if d > between => {
                        self.merge(p, q);
                        for a in &mut assigned[..i] {
                            if *a == q {
                                *a = p;
                            }
                        }
                        self.seed(q, &x);
                        born = true;
                    }
                    _ => assigned[i] = c,
                }
            }
        }
        for (i, &c) in assigned[..n].iter().enumerate() {
            if c == usize::MAX {
                continue;
            }
            self.counts[c] = (self.counts[c] + 1).min(COUNT_CAP);
            let eta = 1.0 / self.counts[c] as f32;
            let x = &self.batch[i];
            for (m, v) in self.centroids[c].iter_mut().zip(x) {
                *m += eta * (v - *m);
            }
        }
        for c in 0..self.used {
            self.refresh_norm(c);
        }
        self.batches_since_remap += 1;
        if born || self.batches_since_remap >= REMAP_EVERY {
            self.remap();
        }
    }

    fn deleted(&mut self, tenant: u32, path: &str, lifetime_bytes: u64) {
        let f = features(tenant, path, Reason::Create, 0);
        let sig = f.sig;
        let mut x = self.open.take(f.key).unwrap_or(f.x);
        let life = log2(lifetime_bytes);
        self.observe_lifetime(sig, life);
        x[D_LIFE] = self.predicted_lifetime(self.kind(sig)) * LIFE_WEIGHT;
        self.batch[self.batch_len] = x;
        self.batch_len += 1;
        if self.batch_len == BATCH {
            self.train();
        }
    }
}

impl Policy for Learn {
    fn init(&mut self, max_streams: u32) {
        self.max_streams = max_streams;
        self.k = (max_streams as usize).clamp(1, K_MAX);
        self.used = self.used.min(self.k);
    }

    fn place(&mut self, request: &Request) -> Option<Decision> {
        let Features {
            mut x,
            sig,
            key,
            support,
            norm2,
        } = features(request.tenant, request.path, request.reason, request.size);
        let kind = self.kind(sig);
        let life = self.predicted_lifetime(kind) * LIFE_WEIGHT;
        x[D_LIFE] = life;
        self.open.insert(key, &x);
        let cluster = self.cluster_for(&x, &support, norm2 + life * life, kind);
        let stream = self.stream_of_cluster(cluster);
        Some(Decision::zoned(stream).group(stream))
    }

    fn event(&mut self, event: &Event) {
        if let Event::Deleted {
            tenant,
            path,
            lifetime_bytes,
            ..
        } = *event
        {
            self.deleted(tenant, path, lifetime_bytes);
        }
    }
}

export_policy!(Learn, Learn::default());

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};

    /// Deterministic pseudo-random numbers for the synthetic workloads.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn create(p: &mut Learn, path: &str) -> Decision {
        p.place(&Request {
            tenant: 1,
            reason: Reason::Create,
            size: 0,
            path,
        })
        .expect("learn always decides")
    }

    fn delete(p: &mut Learn, path: &str, lifetime_bytes: u64) {
        p.event(&Event::Deleted {
            tenant: 1,
            path,
            lifetime_bytes,
            lifetime_secs: 0.0,
            stream: 0,
            group: 0,
        });
    }

    const MIB: u64 = 1 << 20;

    /// An LSM-shaped workload: a WAL per memtable, dropped after the flush; tables from
    /// flushes, dropped at random by "compactions" once more than 40 are live.
    fn lsm(p: &mut Learn, flushes: u32, rng: &mut XorShift) -> u64 {
        let mut written = 0u64;
        let mut file = 3u64;
        let mut wal: Option<(String, u64)> = None;
        let mut tables: Vec<(String, u64)> = Vec::new();
        for _ in 0..flushes {
            file += 1;
            let log = format!("db/{file:06}.log");
            create(p, &log);
            if let Some((old, born)) = wal.replace((log, written)) {
                delete(p, &old, written - born);
            }
            written += 4 * MIB + rng.next() % MIB;
            for _ in 0..2 {
                file += 1;
                let table = format!("db/{file:06}.ldb");
                create(p, &table);
                tables.push((table, written));
                written += 2 * MIB + rng.next() % MIB;
            }
            while tables.len() > 40 {
                let (old, born) = tables.swap_remove((rng.next() % 40) as usize);
                delete(p, &old, written - born);
            }
        }
        written
    }

    #[test]
    fn untrained_everything_goes_to_stream_zero() {
        let mut p = Learn::default();
        p.init(8);
        for f in [
            "db/000005.log",
            "db/000007.ldb",
            "db/CURRENT",
            "x",
            "a/b/c.d",
        ] {
            assert_eq!(create(&mut p, f), Decision::zoned(0), "{f}");
        }
    }

    #[test]
    fn learns_to_keep_wal_and_tables_apart() {
        let mut p = Learn::default();
        p.init(8);
        let mut rng = XorShift(0x5eed);
        lsm(&mut p, 300, &mut rng);
        assert!(p.clusters() >= 2, "{} clusters", p.clusters());

        let logs: Vec<u32> = (1000..1010)
            .map(|n| create(&mut p, &format!("db/{n:06}.log")).stream)
            .collect();
        let tables: Vec<u32> = (2000..2010)
            .map(|n| create(&mut p, &format!("db/{n:06}.ldb")).stream)
            .collect();
        assert!(logs.iter().all(|&s| s == logs[0]), "logs {logs:?}");
        assert!(tables.iter().all(|&s| s == tables[0]), "tables {tables:?}");
        assert_ne!(logs[0], tables[0]);
        assert!(
            logs[0] < tables[0],
            "the shorter-lived WAL gets the lower stream"
        );
        let d = create(&mut p, "db/001234.log");
        assert_eq!(d.group, d.stream);
        assert!(tables[0] < 4);
    }

    #[test]
    fn placement_is_deterministic_and_stable_once_trained() {
        let run = |seed: u64| {
            let mut p = Learn::default();
            p.init(8);
            let mut rng = XorShift(seed);
            lsm(&mut p, 100, &mut rng);
            let mut seen = Vec::new();
            // Keep the workload going: the decisions stay where they were.
            for round in 0..20u32 {
                seen.push((
                    create(&mut p, &format!("db/{round:06}.log")).stream,
                    create(&mut p, &format!("db/{round:06}.ldb")).stream,
                ));
                lsm(&mut p, 25, &mut rng);
            }
            seen
        };
        for seed in [1, 5, 42, 0x5eed] {
            let seen = run(seed);
            assert!(seen.iter().all(|&s| s == seen[0]), "seed {seed}: {seen:?}");
            assert_ne!(seen[0].0, seen[0].1);
            assert_eq!(run(seed), seen, "deterministic");
        }
    }

    #[test]
    fn groups_many_kinds_by_lifetime() {
        // (name pattern, log2 of the lifetime in bytes): three short-lived kinds, three
        // long-lived; for the first third of the run only the short-lived ones exist.
        let kinds = [
            ("app/q/#.log", 22),
            ("app/tmp/scratch-#.tmp", 21),
            ("app/#-wal", 23),
            ("app/t/#.sst", 29),
            ("app/idx/#.idx", 30),
            ("app/#.dat", 28),
        ];
        for max in [2u32, 3, 4] {
            let mut p = Learn::default();
            p.init(max);
            let mut rng = XorShift(3);
            let mut live: Vec<(String, u64, u64)> = Vec::new();
            let mut now = 0u64;
            for n in 0..3000u64 {
                let k = (rng.next() % if n < 1000 { 3 } else { 6 }) as usize;
                let path = kinds[k].0.replace('#', &format!("{n:06}"));
                create(&mut p, &path);
                let life = (1u64 << kinds[k].1) + rng.next() % (1u64 << kinds[k].1);
                live.push((path, now, now + life));
                now += MIB;
                live.retain(|(path, born, dies)| {
                    let dead = *dies <= now;
                    if dead {
                        delete(&mut p, path, now - born);
                    }
                    !dead
                });
            }
            let s: Vec<u32> = kinds
                .iter()
                .map(|(k, _)| create(&mut p, &k.replace('#', "999999")).stream)
                .collect();
            for short in &s[..3] {
                assert!(!s[3..].contains(short), "{max} streams: {s:?}");
            }
            if max == 2 {
                assert_eq!(s, [0, 0, 0, 1, 1, 1]);
            }
        }
    }

    #[test]
    fn streams_stay_within_the_budget() {
        for max in [0, 1, 2, 3, 8] {
            let mut p = Learn::default();
            p.init(max);
            let mut rng = XorShift(7);
            lsm(&mut p, 150, &mut rng);
            assert!(p.clusters() <= K_MAX && p.clusters() <= max.max(1) as usize);
            for f in ["db/1.log", "db/2.ldb", "db/MANIFEST-000001", "other/file"] {
                let s = create(&mut p, f).stream;
                assert!(s < max.max(1), "{f}: stream {s} with {max} streams");
            }
        }
    }

    #[test]
    fn features_ignore_digits_and_see_extensions() {
        let f = |tenant, path, reason, size| features(tenant, path, reason, size);
        let a = f(0, "db/000005.log", Reason::Create, 0);
        let b = f(0, "db/000123.log", Reason::Create, 0);
        let c = f(0, "db/000005.ldb", Reason::Create, 0);
        assert_eq!(a.x, b.x);
        assert_eq!(a.sig, b.sig);
        assert_ne!(a.key, b.key);
        assert_ne!(a.sig, c.sig);
        assert!(distance2(&a.x, &c.x) > 0.5, "a different extension is far");
        assert_ne!(a.sig, f(0, "db/000005-log", Reason::Create, 0).sig);
        assert_ne!(a.sig, f(0, "db/000005lo.g", Reason::Create, 0).sig);
        assert_eq!(
            a.sig,
            f(0, "elsewhere/9.log", Reason::Create, 0).sig,
            "the name only"
        );
        let d = f(0, "other/deep/000005.log", Reason::OpenForWrite, 1 << 20);
        assert!(d.x[D_DEPTH] > a.x[D_DEPTH]);
        assert!(d.x[D_SIZE] > 0.0);
        let t = f(1, "db/000005.log", Reason::Create, 0);
        assert_ne!(a.sig, t.sig, "tenants learn apart");
        assert_ne!(a.key, t.key);
        let norm2: f32 = a.x[..D_EXT].iter().map(|v| v * v).sum();
        assert!((norm2 - 1.0).abs() < 1e-5);
        // Bucket collisions: the incremental norm is still exact.
        let long = f(
            0,
            "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u.v",
            Reason::Rename,
            9,
        );
        let norm2: f32 = long.x[..D_EXT].iter().map(|v| v * v).sum();
        assert!((norm2 - 1.0).abs() < 1e-5);
        for g in [&a, &c, &d, &long] {
            let dims = g.support.dims();
            for (i, v) in g.x.iter().enumerate() {
                let n = dims.iter().filter(|&&s| s as usize == i).count();
                assert!(n <= 1, "dimension {i} listed twice");
                assert!(*v == 0.0 || n == 1, "dimension {i} non-zero but not listed");
            }
            assert!(dims.contains(&(D_LIFE as u8)));
            let norm2: f32 = g.x.iter().map(|v| v * v).sum();
            assert!((norm2 - g.norm2).abs() < 1e-5, "{norm2} vs {}", g.norm2);
        }
        let e = f(0, "", Reason::Create, 0);
        assert!(e.x.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn log2_is_close() {
        assert_eq!(log2(0), 0.0);
        assert_eq!(log2(1), 0.0);
        assert_eq!(log2(1 << 40), 40.0);
        for x in [3u64, 1000, 123_456_789, u64::MAX] {
            assert!((log2(x) - (x as f64).log2() as f32).abs() < 0.09, "{x}");
        }
    }

    #[test]
    fn open_files_match_a_reference_map_and_evict_the_oldest() {
        let mut open = OpenFiles::default();
        // key -> (value, insertion number); insertions of new keys in ring order.
        let mut reference: HashMap<u64, (f32, u32)> = HashMap::new();
        let mut ring: VecDeque<(u64, u32)> = VecDeque::new();
        let mut rng = XorShift(99);
        let mut vector = [0.0; DIM];
        for step in 0..60_000u32 {
            // Keys from a small range, so inserts hit existing keys and takes hit often.
            let key = rng.next() % 6000 + 1;
            if rng.next().is_multiple_of(3) {
                let got = open.take(key).map(|v| v[0]);
                assert_eq!(
                    got,
                    reference.remove(&key).map(|e| e.0),
                    "take {key} at {step}"
                );
            } else {
                vector[0] = step as f32;
                open.insert(key, &vector);
                match reference.get_mut(&key) {
                    Some(e) => e.0 = step as f32,
                    None => {
                        reference.insert(key, (step as f32, step));
                        ring.push_back((key, step));
                    }
                }
                // A new key took the oldest slot of the ring: whatever lived there is gone.
                if ring.len() > OPEN_FILES {
                    let (old, at) = ring.pop_front().unwrap();
                    if reference.get(&old).is_some_and(|e| e.1 == at) {
                        reference.remove(&old);
                    }
                }
            }
        }
        assert_eq!(open.len(), reference.len());
        for (k, v) in &reference {
            assert_eq!(open.take(*k).map(|x| x[0]), Some(v.0));
        }
        assert!(open.is_empty());
    }

    #[test]
    fn a_decision_is_cheap() {
        let mut p = Learn::default();
        p.init(8);
        let mut rng = XorShift(1);
        lsm(&mut p, 200, &mut rng);
        let paths: Vec<String> = (0..1000).map(|n| format!("db/{n:06}.ldb")).collect();
        let start = std::time::Instant::now();
        let rounds = 100;
        for _ in 0..rounds {
            for path in &paths {
                std::hint::black_box(create(&mut p, path));
            }
        }
        let per = start.elapsed() / (rounds * paths.len() as u32);
        // Natively, unoptimised in a debug build; the sandboxed figure is the host's bench.
        assert!(per.as_micros() < 50, "{per:?} per decision");
    }
}
