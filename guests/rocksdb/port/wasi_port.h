// Force-included (`-include`) into every RocksDB file built for WASI: the few POSIX names
// RocksDB's POSIX port uses that wasi-libc does not declare. RocksDB itself stays unmodified
// for these; see ../patches for the two places a shim cannot reach.
#ifndef VALET_ROCKSDB_WASI_PORT_H
#define VALET_ROCKSDB_WASI_PORT_H

#ifdef __wasi__
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

// No direct I/O in WASI: RocksDB adds O_DIRECT only when use_direct_reads/writes is asked.
#ifndef O_DIRECT
#define O_DIRECT 0
#endif

// Device numbers (RocksDB reads them to find a file's block device, for logical block size
// hints): WASI reports none, so both are 0.
#ifndef major
#define major(dev) ((unsigned)(((dev) >> 8) & 0xfff))
#define minor(dev) ((unsigned)((dev) & 0xff))
#endif

#ifdef __cplusplus
extern "C" {
#endif

// One user in a WASI sandbox.
static inline uid_t geteuid(void) { return 0; }

// A process can only signal itself (RocksDB's port::Crash sends SIGTERM to getpid()).
static inline int kill(pid_t pid, int sig) {
  (void)pid;
  return raise(sig);
}

#ifdef __cplusplus
}
#endif
#endif  // __wasi__
#endif
