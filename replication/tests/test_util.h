// Helpers shared by the replication tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace slipstream::replication::test {

// A fresh directory under $TMPDIR (or /tmp), removed at the end (an ASSERT that returns early
// included).
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/slipstream-repl-XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A temporary directory holding a standby's image directory and pg_wal.
class BackupDirs {
 public:
  BackupDirs() {
    std::filesystem::create_directories(images());
    std::filesystem::create_directories(wal());
  }
  std::string images() const { return root_.path() + "/images"; }
  std::string wal() const { return root_.path() + "/pg_wal"; }

 private:
  TempDir root_;
};

}  // namespace slipstream::replication::test
