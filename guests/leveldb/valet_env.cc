// Valet's LevelDB Env: plain POSIX calls, which wasi-libc maps to WASI preview 1 and which
// the native build uses as they are, so both builds do the same file operations.
//
// Differences from LevelDB's PosixEnv, all because a WASI guest has one thread and no
// advisory locks: Schedule and StartThread run the job inline, file locks are bookkeeping
// inside this process, and random-access files are read with pread (no mmap). Like
// PosixEnv, WritableFile::Sync is fdatasync, and syncing a MANIFEST first syncs its
// directory. Stock wasmtime refuses fsync on a directory (EBADF), which is tolerated, and
// every read loops until it has what it asked for or reaches the end of the file, since a
// WASI host may return short reads.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "leveldb/env.h"
#include "leveldb/slice.h"
#include "leveldb/status.h"

namespace leveldb {
namespace {

constexpr size_t kWriteBufferSize = 64 * 1024;

Status ErrnoStatus(const std::string& context, int err) {
  if (err == ENOENT) {
    return Status::NotFound(context, std::strerror(err));
  }
  return Status::IOError(context, std::strerror(err));
}

// Reads up to `n` bytes at `offset` (or at the current position when `offset` is negative),
// looping over short reads; stops early only at end of file.
Status ReadFully(int fd, const std::string& name, off_t offset, size_t n, char* dst,
                 size_t* got) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = offset < 0 ? ::read(fd, dst + done, n - done)
                           : ::pread(fd, dst + done, n - done, offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      *got = done;
      return ErrnoStatus(name, errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  *got = done;
  return Status::OK();
}

Status WriteFully(int fd, const std::string& name, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(name, errno);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// fsync of a directory, so a newly created file's entry is durable. A host that cannot
// sync directories (stock wasmtime answers EBADF; others EINVAL or ENOTSUP) is not an
// error: there is nothing more this process could do about it.
Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoStatus(dir, errno);
  Status s;
  if (::fsync(fd) != 0 && errno != EBADF && errno != EINVAL && errno != ENOTSUP) {
    s = ErrnoStatus(dir, errno);
  }
  ::close(fd);
  return s;
}

class SeqFile final : public SequentialFile {
 public:
  SeqFile(std::string name, int fd) : name_(std::move(name)), fd_(fd) {}
  ~SeqFile() override { ::close(fd_); }

  Status Read(size_t n, Slice* result, char* scratch) override {
    size_t got = 0;
    Status s = ReadFully(fd_, name_, -1, n, scratch, &got);
    *result = Slice(scratch, got);
    return s;
  }

  Status Skip(uint64_t n) override {
    if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) {
      return ErrnoStatus(name_, errno);
    }
    return Status::OK();
  }

 private:
  const std::string name_;
  const int fd_;
};

class RandFile final : public RandomAccessFile {
 public:
  RandFile(std::string name, int fd) : name_(std::move(name)), fd_(fd) {}
  ~RandFile() override { ::close(fd_); }

  Status Read(uint64_t offset, size_t n, Slice* result,
              char* scratch) const override {
    size_t got = 0;
    Status s = ReadFully(fd_, name_, static_cast<off_t>(offset), n, scratch, &got);
    *result = Slice(scratch, got);
    return s;
  }

 private:
  const std::string name_;
  const int fd_;
};

// Appends through a 64 KiB buffer, as PosixEnv does.
class WriteFile final : public WritableFile {
 public:
  WriteFile(std::string name, int fd)
      : name_(std::move(name)),
        dir_(DirName(name_)),
        is_manifest_(BaseName(name_).rfind("MANIFEST", 0) == 0),
        fd_(fd) {
    buf_.reserve(kWriteBufferSize);
  }
  ~WriteFile() override {
    if (fd_ >= 0) Close();
  }

  Status Append(const Slice& data) override {
    const char* p = data.data();
    size_t n = data.size();
    size_t room = kWriteBufferSize - buf_.size();
    size_t take = n < room ? n : room;
    buf_.insert(buf_.end(), p, p + take);
    p += take;
    n -= take;
    if (n == 0) return Status::OK();
    Status s = Flush();
    if (!s.ok()) return s;
    if (n < kWriteBufferSize) {
      buf_.insert(buf_.end(), p, p + n);
      return Status::OK();
    }
    return WriteFully(fd_, name_, p, n);
  }

  Status Close() override {
    Status s = Flush();
    if (::close(fd_) != 0 && s.ok()) s = ErrnoStatus(name_, errno);
    fd_ = -1;
    return s;
  }

  Status Flush() override {
    Status s = WriteFully(fd_, name_, buf_.data(), buf_.size());
    buf_.clear();
    return s;
  }

  Status Sync() override {
    // A new MANIFEST must be reachable before CURRENT names it.
    if (is_manifest_) {
      Status s = SyncDir(dir_);
      if (!s.ok()) return s;
    }
    Status s = Flush();
    if (!s.ok()) return s;
    if (::fdatasync(fd_) != 0) return ErrnoStatus(name_, errno);
    return Status::OK();
  }

 private:
  const std::string name_;
  const std::string dir_;
  const bool is_manifest_;
  int fd_;
  std::vector<char> buf_;
};

class FileLogger final : public Logger {
 public:
  explicit FileLogger(std::FILE* f) : f_(f) {}
  ~FileLogger() override { std::fclose(f_); }

  void Logv(const char* format, va_list ap) override {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    std::fprintf(f_, "%lld.%06ld ", static_cast<long long>(now.tv_sec),
                 static_cast<long>(now.tv_nsec / 1000));
    std::vfprintf(f_, format, ap);
    size_t len = std::strlen(format);
    if (len == 0 || format[len - 1] != '\n') std::fputc('\n', f_);
    std::fflush(f_);
  }

 private:
  std::FILE* const f_;
};

class Lock final : public FileLock {
 public:
  Lock(std::string name, int fd) : name(std::move(name)), fd(fd) {}
  const std::string name;
  const int fd;
};

class ValetEnv final : public Env {
 public:
  Status NewSequentialFile(const std::string& fname,
                           SequentialFile** result) override {
    return Open(fname, O_RDONLY, result, [](const std::string& n, int fd) {
      return static_cast<SequentialFile*>(new SeqFile(n, fd));
    });
  }

  Status NewRandomAccessFile(const std::string& fname,
                             RandomAccessFile** result) override {
    return Open(fname, O_RDONLY, result, [](const std::string& n, int fd) {
      return static_cast<RandomAccessFile*>(new RandFile(n, fd));
    });
  }

  Status NewWritableFile(const std::string& fname,
                         WritableFile** result) override {
    return Open(fname, O_WRONLY | O_CREAT | O_TRUNC, result, NewWriteFile);
  }

  Status NewAppendableFile(const std::string& fname,
                           WritableFile** result) override {
    return Open(fname, O_WRONLY | O_CREAT | O_APPEND, result, NewWriteFile);
  }

  bool FileExists(const std::string& fname) override {
    return ::access(fname.c_str(), F_OK) == 0;
  }

  Status GetChildren(const std::string& dir,
                     std::vector<std::string>* result) override {
    result->clear();
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(dir, errno);
    while (struct dirent* e = ::readdir(d)) {
      result->emplace_back(e->d_name);
    }
    ::closedir(d);
    return Status::OK();
  }

  Status DeleteFile(const std::string& fname) override {
    return Check(::unlink(fname.c_str()), fname);
  }

  Status CreateDir(const std::string& dirname) override {
    return Check(::mkdir(dirname.c_str(), 0755), dirname);
  }

  Status DeleteDir(const std::string& dirname) override {
    return Check(::rmdir(dirname.c_str()), dirname);
  }

  Status GetFileSize(const std::string& fname, uint64_t* size) override {
    struct stat st;
    if (::stat(fname.c_str(), &st) != 0) {
      *size = 0;
      return ErrnoStatus(fname, errno);
    }
    *size = static_cast<uint64_t>(st.st_size);
    return Status::OK();
  }

  Status RenameFile(const std::string& src, const std::string& target) override {
    return Check(::rename(src.c_str(), target.c_str()), src);
  }

  // One process, one thread: a lock only has to keep this process from opening the same
  // database twice. The file is created as PosixEnv creates it.
  Status LockFile(const std::string& fname, FileLock** lock) override {
    *lock = nullptr;
    if (locked_.count(fname) != 0) {
      return Status::IOError("lock " + fname, "already held by this process");
    }
    int fd = ::open(fname.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0) return ErrnoStatus(fname, errno);
    locked_.insert(fname);
    *lock = new Lock(fname, fd);
    return Status::OK();
  }

  Status UnlockFile(FileLock* lock) override {
    Lock* l = static_cast<Lock*>(lock);
    locked_.erase(l->name);
    ::close(l->fd);
    delete l;
    return Status::OK();
  }

  // No threads: background work runs now, on the caller's thread.
  void Schedule(void (*function)(void*), void* arg) override { function(arg); }
  void StartThread(void (*function)(void*), void* arg) override { function(arg); }

  Status GetTestDirectory(std::string* path) override {
    const char* env = std::getenv("TEST_TMPDIR");
    *path = env != nullptr && env[0] != '\0' ? env : "/tmp/leveldbtest";
    CreateDir(*path);
    return Status::OK();
  }

  Status NewLogger(const std::string& fname, Logger** result) override {
    std::FILE* f = std::fopen(fname.c_str(), "w");
    if (f == nullptr) {
      *result = nullptr;
      return ErrnoStatus(fname, errno);
    }
    *result = new FileLogger(f);
    return Status::OK();
  }

  uint64_t NowMicros() override {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return static_cast<uint64_t>(now.tv_sec) * 1000000 +
           static_cast<uint64_t>(now.tv_nsec) / 1000;
  }

  void SleepForMicroseconds(int micros) override {
    struct timespec t;
    t.tv_sec = micros / 1000000;
    t.tv_nsec = static_cast<long>(micros % 1000000) * 1000;
    while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
  }

 private:
  static WritableFile* NewWriteFile(const std::string& n, int fd) {
    return new WriteFile(n, fd);
  }

  template <typename T, typename Make>
  static Status Open(const std::string& fname, int flags, T** result, Make make) {
    int fd = ::open(fname.c_str(), flags, 0644);
    if (fd < 0) {
      *result = nullptr;
      return ErrnoStatus(fname, errno);
    }
    *result = make(fname, fd);
    return Status::OK();
  }

  static Status Check(int rc, const std::string& context) {
    return rc == 0 ? Status::OK() : ErrnoStatus(context, errno);
  }

  std::set<std::string> locked_;
};

}  // namespace

Env* Env::Default() {
  static ValetEnv* env = new ValetEnv();
  return env;
}

}  // namespace leveldb
