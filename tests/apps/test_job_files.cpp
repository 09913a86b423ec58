// apps/train_job_file.hpp: the job files launchers and workers write carry
// their writer's process id, and a sweep removes only those of writers that
// are gone (a launcher or worker killed by SIGKILL) which this user owns.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "apps/train_job_file.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::app;
namespace fs = std::filesystem;

namespace {

/// The id of a process that has ended (and was reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(::kill(pid, 0) == -1);  // ESRCH until the id is reused
  REQUIRE(errno == ESRCH);
  return pid;
}

void touch(const fs::path& p) { std::ofstream(p) << "{}"; }

}  // namespace

TEST_CASE("a job file names its writer, and the sweep removes only files of writers that are gone") {
  const fs::path written = write_job_file(launcher_job_file_prefix, "{\"pp\": 1}\n");
  {
    const std::string name = written.filename().string();
    CHECK(name.rfind(std::string(launcher_job_file_prefix) + std::to_string(::getpid()) + "-", 0) == 0);
    CHECK(is_job_file(written.string(), launcher_job_file_prefix));
    CHECK_FALSE(is_worker_job_file(written.string()));
    struct stat st {};
    REQUIRE(::stat(written.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    std::ostringstream text;
    text << std::ifstream(written).rdbuf();
    CHECK(text.str() == "{\"pp\": 1}\n");
    fs::remove(written);
  }

  testing::temp_dir_guard dir("job-files");
  const std::string dead = std::to_string(dead_pid());
  const std::string self = std::to_string(::getpid());
  touch(dir / ("corolla-job-" + dead + "-aB3xYz"));      // a launcher killed: removed
  touch(dir / ("corolla-joined-" + dead + "-Qw3rTy"));   // a worker killed: removed
  touch(dir / ("corolla-job-" + self + "-aB3xYz"));      // alive: kept
  touch(dir / "corolla-job-aB3xYz");                     // an older build's name, no id: kept
  touch(dir / ("corolla-job-x" + dead + "-aB3xYz"));     // not an id: kept
  touch(dir / ("other-" + dead + "-aB3xYz"));            // not a job file: kept
  fs::create_directory(dir / ("corolla-job-" + dead + "-dir0"));  // not a file: kept
  fs::create_symlink(dir / "corolla-job-aB3xYz", dir / ("corolla-joined-" + dead + "-link00"));  // a link: kept

  CHECK(sweep_stale_job_files(dir.path()) == 2);
  CHECK_FALSE(fs::exists(dir / ("corolla-job-" + dead + "-aB3xYz")));
  CHECK_FALSE(fs::exists(dir / ("corolla-joined-" + dead + "-Qw3rTy")));
  CHECK(fs::exists(dir / ("corolla-job-" + self + "-aB3xYz")));
  CHECK(fs::exists(dir / "corolla-job-aB3xYz"));
  CHECK(fs::exists(dir / ("corolla-job-x" + dead + "-aB3xYz")));
  CHECK(fs::exists(dir / ("other-" + dead + "-aB3xYz")));
  CHECK(fs::is_directory(dir / ("corolla-job-" + dead + "-dir0")));
  CHECK(fs::is_symlink(dir / ("corolla-joined-" + dead + "-link00")));
  // Nothing left to remove; a directory that is not there is no error.
  CHECK(sweep_stale_job_files(dir.path()) == 0);
  CHECK(sweep_stale_job_files(dir / "missing") == 0);
}
