// A db_bench-compatible driver for LevelDB on one thread (LevelDB's own db_bench needs
// threads, which a WASI guest does not have).
//
//   leveldb --benchmarks=fillseq,fillrandom,overwrite,readseq,readrandom,readwhilewriting
//           [--num N] [--reads N] [--key_size B] [--value_size B] [--sync 0|1]
//           [--db DIR] [--use_existing_db 0|1] [--write_buffer_size B]
//           [--cache_size B] [--verify 0|1]
//
// Flags take `--name=value` or `--name value`. Each benchmark prints db_bench's line
//   fillseq      :       3.123 micros/op;  320204 ops/sec;   58.3 MB/s
// and the percentiles of its per-operation latencies (the reads', for readwhilewriting):
//   Percentiles (micros): P50: 2.10 P99: 10.50 P99.9: 40.00 P99.99: 120.00
//
// Differences from db_bench: fillrandom writes every key once in a random order (a
// shuffled permutation), so the reads after it can expect to find every key; and
// readwhilewriting interleaves one random overwrite after every kReadsPerWrite reads
// instead of running a writer thread. Values are derived from the key and a generation
// (one per write benchmark), so --verify=1 can reopen the database and check every key
// the write benchmarks left behind, byte for byte. Exit status: 0, 1 on an error, 2 when
// the verification finds a wrong or missing value.

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "leveldb/cache.h"
#include "leveldb/db.h"
#include "leveldb/env.h"
#include "leveldb/iterator.h"
#include "leveldb/options.h"
#include "leveldb/write_batch.h"

namespace {

constexpr uint64_t kReadsPerWrite = 16;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "leveldb bench: %s\n", what.c_str());
  std::exit(1);
}

void CheckOk(const leveldb::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

struct Flags {
  std::string benchmarks = "fillseq,fillrandom,overwrite,readseq,readrandom,readwhilewriting";
  int64_t num = 1000000;
  int64_t reads = -1;  // -1: same as num
  int64_t key_size = 20;
  int64_t value_size = 400;
  bool sync = false;
  std::string db = "/data/leveldb";
  bool use_existing_db = false;
  int64_t write_buffer_size = static_cast<int64_t>(leveldb::Options().write_buffer_size);
  int64_t cache_size = -1;  // -1: no block cache, as in db_bench
  bool verify = false;
};

int64_t ParseInt(const std::string& name, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0) {
    Die("--" + name + " wants an integer, not '" + value + "'");
  }
  return v;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) Die("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    std::string value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Die("--" + name + " wants a value");
    }
    if (name == "benchmarks") {
      f.benchmarks = value;
    } else if (name == "db") {
      f.db = value;
    } else if (name == "num") {
      f.num = ParseInt(name, value);
    } else if (name == "reads") {
      f.reads = ParseInt(name, value);
    } else if (name == "key_size") {
      f.key_size = ParseInt(name, value);
    } else if (name == "value_size") {
      f.value_size = ParseInt(name, value);
    } else if (name == "sync") {
      f.sync = ParseInt(name, value) != 0;
    } else if (name == "use_existing_db") {
      f.use_existing_db = ParseInt(name, value) != 0;
    } else if (name == "write_buffer_size") {
      f.write_buffer_size = ParseInt(name, value);
    } else if (name == "cache_size") {
      f.cache_size = ParseInt(name, value);
    } else if (name == "verify") {
      f.verify = ParseInt(name, value) != 0;
    } else {
      Die("unknown flag --" + name);
    }
  }
  if (f.reads < 0) f.reads = f.num;
  if (f.num < 1 || f.num > UINT32_MAX) Die("--num must be between 1 and 2^32-1");
  if (f.value_size < 0) Die("--value_size must not be negative");
  if (f.key_size < static_cast<int64_t>(std::to_string(f.num - 1).size()) ||
      f.key_size > 1024) {
    Die("--key_size must hold the largest key's digits and be at most 1024");
  }
  if (f.write_buffer_size < 1) Die("--write_buffer_size must be positive");
  return f;
}

uint64_t NowNanos() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000 + static_cast<uint64_t>(t.tv_nsec);
}

// splitmix64: the driver's only source of randomness, seeded per benchmark.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix(state_ += 0x9e3779b97f4a7c15ULL); }
  uint64_t Uniform(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// The key of number k: its decimal digits, zero-padded to key_size bytes.
void MakeKey(uint64_t k, int64_t key_size, std::string* out) {
  char digits[24];
  int len = std::snprintf(digits, sizeof(digits), "%" PRIu64, k);
  out->assign(static_cast<size_t>(key_size) - len, '0');
  out->append(digits, len);
}

// The value key k has after the write benchmark of generation `gen` wrote it.
void MakeValue(uint64_t k, uint32_t gen, int64_t size, std::string* out) {
  out->resize(static_cast<size_t>(size));
  Rng rng(Mix(k) ^ (static_cast<uint64_t>(gen) << 32));
  for (size_t i = 0; i < out->size(); i += 8) {
    uint64_t word = rng.Next();
    std::memcpy(&(*out)[i], &word, std::min<size_t>(8, out->size() - i));
  }
}

// Per-operation latencies and totals of one benchmark.
class Stats {
 public:
  explicit Stats(uint64_t expected) : start_(NowNanos()) { latencies_.reserve(expected); }

  void Op(uint64_t nanos, uint64_t bytes) {
    latencies_.push_back(nanos);
    bytes_ += bytes;
  }

  void Report(const char* name, const std::string& message) {
    double seconds = static_cast<double>(NowNanos() - start_) * 1e-9;
    double ops = static_cast<double>(std::max<size_t>(latencies_.size(), 1));
    std::string extra;
    if (bytes_ > 0) {
      char rate[32];
      std::snprintf(rate, sizeof(rate), " %6.1f MB/s",
                    static_cast<double>(bytes_) / 1048576.0 / seconds);
      extra = rate;
    }
    if (!message.empty()) extra += " " + message;
    std::printf("%-12s : %11.3f micros/op; %7.0f ops/sec;%s\n", name, seconds * 1e6 / ops,
                ops / seconds, extra.c_str());
    std::sort(latencies_.begin(), latencies_.end());
    std::printf("Percentiles (micros): P50: %.2f P99: %.2f P99.9: %.2f P99.99: %.2f\n",
                Percentile(0.5), Percentile(0.99), Percentile(0.999), Percentile(0.9999));
    std::fflush(stdout);
  }

 private:
  // Exact percentile of the sorted latencies, in microseconds.
  double Percentile(double q) const {
    if (latencies_.empty()) return 0;
    size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(latencies_.size())));
    size_t index = std::min(std::max<size_t>(rank, 1) - 1, latencies_.size() - 1);
    return static_cast<double>(latencies_[index]) / 1000.0;
  }

  const uint64_t start_;
  uint64_t bytes_ = 0;
  std::vector<uint64_t> latencies_;
};

class Benchmark {
 public:
  explicit Benchmark(const Flags& flags)
      : f_(flags),
        cache_(flags.cache_size >= 0 ? leveldb::NewLRUCache(flags.cache_size) : nullptr),
        generation_(flags.num, 0),
        fresh_(!flags.use_existing_db) {
    if (fresh_) DestroyDb();
    Open();
  }

  ~Benchmark() {
    delete db_;
    delete cache_;
  }

  void Run(const std::string& name, uint64_t seed) {
    Rng rng(seed);
    if (name == "fillseq" || name == "fillrandom") {
      if (f_.use_existing_db) {
        std::printf("%-12s : skipped (--use_existing_db is true)\n", name.c_str());
        return;
      }
      delete db_;
      db_ = nullptr;
      DestroyDb();
      std::fill(generation_.begin(), generation_.end(), 0);
      fresh_ = true;
      Open();
      Write(name, name == "fillseq" ? Order::kSequential : Order::kPermutation, rng);
    } else if (name == "overwrite") {
      Write(name, Order::kRandom, rng);
    } else if (name == "readseq") {
      ReadSeq(name);
    } else if (name == "readrandom") {
      ReadRandom(name, rng, false);
    } else if (name == "readwhilewriting") {
      ReadRandom(name, rng, true);
    } else {
      Die("unknown benchmark '" + name + "'");
    }
  }

  // Reopens the database and checks every key written by this run; when the run started
  // from an empty database, also that nothing else is in it. Returns the mismatches.
  uint64_t Verify() {
    delete db_;
    db_ = nullptr;
    Open();
    uint64_t bad = 0;
    uint64_t present = 0;
    auto mismatch = [&bad](const std::string& key, const std::string& why) {
      if (bad++ < 10) std::fprintf(stderr, "verify: key %s: %s\n", key.c_str(), why.c_str());
    };
    std::string key;
    std::string expected;
    std::string got;
    for (uint64_t k = 0; k < generation_.size(); k++) {
      if (generation_[k] == 0) continue;
      present++;
      MakeKey(k, f_.key_size, &key);
      MakeValue(k, generation_[k], f_.value_size, &expected);
      leveldb::Status s = db_->Get(leveldb::ReadOptions(), key, &got);
      if (!s.ok()) {
        mismatch(key, s.ToString());
      } else if (got != expected) {
        mismatch(key, "wrong value");
      }
    }
    if (fresh_) {
      uint64_t seen = 0;
      leveldb::Iterator* it = db_->NewIterator(leveldb::ReadOptions());
      for (it->SeekToFirst(); it->Valid(); it->Next()) {
        seen++;
        std::string k = it->key().ToString();
        char* end = nullptr;
        uint64_t n = std::strtoull(k.c_str(), &end, 10);
        if (*end != '\0' || n >= generation_.size() || generation_[n] == 0) {
          mismatch(k, "present but never written");
          continue;
        }
        MakeValue(n, generation_[n], f_.value_size, &expected);
        if (it->value() != leveldb::Slice(expected)) mismatch(k, "wrong value in a scan");
      }
      CheckOk(it->status(), "verify scan");
      delete it;
      if (seen != present) {
        mismatch("*", "scan saw " + std::to_string(seen) + " keys, expected " +
                          std::to_string(present));
      }
    }
    if (bad == 0) std::printf("verify: %" PRIu64 " keys ok\n", present);
    return bad;
  }

 private:
  enum class Order { kSequential, kPermutation, kRandom };

  void DestroyDb() { CheckOk(leveldb::DestroyDB(f_.db, leveldb::Options()), "destroying the db"); }

  void Open() {
    leveldb::Options options;
    options.create_if_missing = true;
    options.block_cache = cache_;
    options.write_buffer_size = static_cast<size_t>(f_.write_buffer_size);
    CheckOk(leveldb::DB::Open(options, f_.db, &db_), "opening the db");
  }

  void Put(uint64_t k, uint32_t gen, std::string* key, std::string* value, Stats* stats) {
    MakeKey(k, f_.key_size, key);
    MakeValue(k, gen, f_.value_size, value);
    leveldb::WriteOptions options;
    options.sync = f_.sync;
    leveldb::WriteBatch batch;
    batch.Put(*key, *value);
    uint64_t t0 = NowNanos();
    CheckOk(db_->Write(options, &batch), "put");
    uint64_t t1 = NowNanos();
    generation_[k] = gen;
    if (stats != nullptr) stats->Op(t1 - t0, key->size() + value->size());
  }

  void Write(const std::string& name, Order order, Rng& rng) {
    uint32_t gen = ++last_generation_;
    uint64_t n = static_cast<uint64_t>(f_.num);
    std::vector<uint32_t> keys;
    if (order == Order::kPermutation) {
      keys.resize(n);
      for (uint64_t i = 0; i < n; i++) keys[i] = static_cast<uint32_t>(i);
      for (uint64_t i = n - 1; i > 0; i--) std::swap(keys[i], keys[rng.Uniform(i + 1)]);
    }
    Stats stats(n);
    std::string key;
    std::string value;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t k = order == Order::kSequential ? i
                   : order == Order::kPermutation ? keys[i]
                                                  : rng.Uniform(n);
      Put(k, gen, &key, &value, &stats);
    }
    stats.Report(name.c_str(), "");
  }

  void ReadSeq(const std::string& name) {
    Stats stats(static_cast<uint64_t>(f_.reads));
    leveldb::Iterator* it = db_->NewIterator(leveldb::ReadOptions());
    int64_t i = 0;
    uint64_t t0 = NowNanos();
    for (it->SeekToFirst(); i < f_.reads && it->Valid(); it->Next()) {
      size_t bytes = it->key().size() + it->value().size();
      uint64_t t1 = NowNanos();
      stats.Op(t1 - t0, bytes);
      t0 = t1;
      i++;
    }
    CheckOk(it->status(), "readseq");
    delete it;
    stats.Report(name.c_str(), "");
  }

  // Random point reads; with `writing`, one random overwrite after every kReadsPerWrite
  // reads (its time is not in the read latencies).
  void ReadRandom(const std::string& name, Rng& rng, bool writing) {
    uint32_t gen = writing ? ++last_generation_ : 0;
    Stats stats(static_cast<uint64_t>(f_.reads));
    std::string key;
    std::string value;
    std::string scratch;
    int64_t found = 0;
    for (int64_t i = 0; i < f_.reads; i++) {
      MakeKey(rng.Uniform(static_cast<uint64_t>(f_.num)), f_.key_size, &key);
      uint64_t t0 = NowNanos();
      leveldb::Status s = db_->Get(leveldb::ReadOptions(), key, &value);
      uint64_t t1 = NowNanos();
      if (s.ok()) {
        found++;
      } else if (!s.IsNotFound()) {
        CheckOk(s, "get");
      }
      stats.Op(t1 - t0, 0);
      if (writing && (i + 1) % kReadsPerWrite == 0) {
        Put(rng.Uniform(static_cast<uint64_t>(f_.num)), gen, &scratch, &value, nullptr);
      }
    }
    char message[64];
    std::snprintf(message, sizeof(message), "(%" PRId64 " of %" PRId64 " found)", found,
                  f_.reads);
    stats.Report(name.c_str(), message);
  }

  const Flags f_;
  leveldb::Cache* const cache_;
  leveldb::DB* db_ = nullptr;
  // The generation of each key's current value; 0: not written by this run.
  std::vector<uint32_t> generation_;
  uint32_t last_generation_ = 0;
  // The database held nothing this run did not write.
  bool fresh_;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  std::printf("LevelDB:    version %d.%d\n", leveldb::kMajorVersion, leveldb::kMinorVersion);
  std::printf("Keys:       %" PRId64 " bytes each\n", flags.key_size);
  std::printf("Values:     %" PRId64 " bytes each\n", flags.value_size);
  std::printf("Entries:    %" PRId64 "\n", flags.num);
  std::printf("------------------------------------------------\n");
  std::fflush(stdout);
  Benchmark bench(flags);
  uint64_t seed = 301;
  size_t start = 0;
  while (start <= flags.benchmarks.size()) {
    size_t comma = flags.benchmarks.find(',', start);
    if (comma == std::string::npos) comma = flags.benchmarks.size();
    std::string name = flags.benchmarks.substr(start, comma - start);
    if (!name.empty()) bench.Run(name, seed++);
    start = comma + 1;
  }
  if (flags.verify && bench.Verify() != 0) {
    std::fprintf(stderr, "verify: FAILED\n");
    std::fflush(stdout);
    return 2;
  }
  return 0;
}
