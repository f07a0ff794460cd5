// Writes random keys into a RocksDB store with sync=1 and prints each key once RocksDB has
// acknowledged it, so a test that SIGKILLs the process knows exactly what must survive:
//
//   acked_writer DB SEED COUNT    writes COUNT keys (fillrandom-like: 16-byte keys drawn from a
//                                 seeded generator, 100-byte values derived from the key),
//                                 one synced Put each, printing "acked KEY" after each
//
// The store is checked from outside with RocksDB's own `ldb scan`.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <memory>
#include <string>

#include "rocksdb/db.h"
#include "rocksdb/options.h"

namespace {

// splitmix64: a small generator whose sequence is the same on every platform.
uint64_t Next(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The value the test expects for a key: the key repeated, cut to 100 bytes.
std::string ValueFor(const std::string& key) {
  std::string value;
  while (value.size() < 100) value += key;
  value.resize(100);
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: acked_writer DB SEED COUNT\n");
    return 2;
  }
  const std::string path = argv[1];
  uint64_t state = strtoull(argv[2], nullptr, 10);
  const uint64_t count = strtoull(argv[3], nullptr, 10);

  rocksdb::Options options;
  options.create_if_missing = true;
  // Small memtables, so flushes and compactions run while the test kills the process.
  options.write_buffer_size = 256 << 10;
  options.max_background_jobs = 2;
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &db);
  if (!s.ok()) {
    fprintf(stderr, "acked_writer: open %s: %s\n", path.c_str(), s.ToString().c_str());
    return 1;
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  char key[17];
  for (uint64_t i = 0; i < count; i++) {
    snprintf(key, sizeof key, "%016" PRIx64, Next(&state));
    s = db->Put(sync, key, ValueFor(key));
    if (!s.ok()) {
      fprintf(stderr, "acked_writer: put %s: %s\n", key, s.ToString().c_str());
      return 1;
    }
    printf("acked %s\n", key);
    fflush(stdout);
  }
  s = db->Close();
  if (!s.ok()) {
    fprintf(stderr, "acked_writer: close: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
