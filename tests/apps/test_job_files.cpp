// apps/train_job_file.hpp: the job files launchers and workers write carry
// their writer's process id and are held (locked) while it lives, and a
// sweep removes only those nobody holds (a launcher or worker killed by
// SIGKILL) which this user owns.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "apps/train_job_file.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::app;
namespace fs = std::filesystem;

namespace {

void touch(const fs::path& p) { std::ofstream(p) << "{}"; }

/// Whether another open file description can take `p`'s lock now.
bool lock_free(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

}  // namespace

TEST_CASE("a job file names its writer and is held while the writer lives") {
  fs::path written;
  {
    const auto held = write_job_file(launcher_job_file_prefix, "{\"pp\": 1}\n");
    written = held->path();
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
    CHECK_FALSE(lock_free(written));
  }
  // Let go (as when its writer ends, however): the file stays, unheld.
  CHECK(fs::exists(written));
  CHECK(lock_free(written));
  fs::remove(written);
}

TEST_CASE("the sweep removes this user's job files that nobody holds, and nothing else") {
  testing::temp_dir_guard dir("job-files");
  const std::string self = std::to_string(::getpid());
  touch(dir / "corolla-job-4242-aB3xYz");         // a launcher killed: removed
  touch(dir / "corolla-joined-4242-Qw3rTy");      // a worker killed: removed
  touch(dir / "corolla-job-1-aB3xYz");            // an id alive, but nobody holds it: removed
  touch(dir / ("corolla-job-" + self + "-held00"));  // held: kept
  const int holder = ::open((dir / ("corolla-job-" + self + "-held00")).c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(holder >= 0);
  REQUIRE(::flock(holder, LOCK_EX | LOCK_NB) == 0);
  touch(dir / "corolla-job-aB3xYz");                   // an older build's name, no id: kept
  touch(dir / "corolla-job-x4242-aB3xYz");             // not an id: kept
  touch(dir / "other-4242-aB3xYz");                    // not a job file: kept
  fs::create_directory(dir / "corolla-job-4242-dir0");  // not a file: kept
  fs::create_symlink(dir / "corolla-job-aB3xYz", dir / "corolla-joined-4242-link00");  // a link: kept

  CHECK(sweep_stale_job_files(dir.path()) == 3);
  CHECK_FALSE(fs::exists(dir / "corolla-job-4242-aB3xYz"));
  CHECK_FALSE(fs::exists(dir / "corolla-joined-4242-Qw3rTy"));
  CHECK_FALSE(fs::exists(dir / "corolla-job-1-aB3xYz"));
  CHECK(fs::exists(dir / ("corolla-job-" + self + "-held00")));
  CHECK(fs::exists(dir / "corolla-job-aB3xYz"));
  CHECK(fs::exists(dir / "corolla-job-x4242-aB3xYz"));
  CHECK(fs::exists(dir / "other-4242-aB3xYz"));
  CHECK(fs::is_directory(dir / "corolla-job-4242-dir0"));
  CHECK(fs::is_symlink(dir / "corolla-joined-4242-link00"));
  // Let go, the held one goes at the next sweep; a directory that is not
  // there is no error.
  ::close(holder);
  CHECK(sweep_stale_job_files(dir.path()) == 1);
  CHECK(sweep_stale_job_files(dir.path()) == 0);
  CHECK(sweep_stale_job_files(dir / "missing") == 0);
}

TEST_CASE("a LoRA job's adapter travels in the job file, and ranks that would draw another adapter do not join") {
  dist_train_options o;
  o.layout = even_layout(4, 2, 1);
  o.batch = 2;
  o.seq = 8;
  o.steps = 3;
  CHECK_FALSE(job_from_json_text(job_to_json(o).dump(), "job").lora);
  dist_lora l;
  l.config.rank = 8;
  l.config.alpha = 16.0f;
  l.config.rslora = true;
  l.config.targets = {"self_attn.q_proj", "mlp.down_proj"};
  l.seed = 18446744073709551557ull;  // above 2^63: carried as text
  l.from = "/models/adapter";
  l.from_digest = "0123456789abcdef";
  l.base_model = "/models/base";
  l.base_digest = "fedcba9876543210";
  l.base_weights = weight_format::int8;
  o.lora = l;
  const dist_train_options back = job_from_json_text(job_to_json(o).dump(), "job");
  REQUIRE(back.lora);
  CHECK(back.lora->config.rank == 8);
  CHECK(back.lora->config.alpha == 16.0f);
  CHECK(back.lora->config.rslora);
  CHECK(back.lora->config.targets == l.config.targets);
  CHECK(back.lora->seed == l.seed);
  CHECK(back.lora->from == l.from);
  CHECK(back.lora->base_model == l.base_model);
  CHECK(back.lora->from_digest == l.from_digest);
  CHECK(back.lora->base_digest == l.base_digest);
  CHECK(back.lora->base_weights == weight_format::int8);
  // A job file without the field (an older launcher's) trains beside f32.
  nlohmann::json older = job_to_json(o);
  older["lora"].erase("base_weights");
  CHECK(job_from_json_text(older.dump(), "job").lora->base_weights == weight_format::f32);
  older["lora"]["base_weights"] = "int4";
  CHECK_THROWS_WITH(job_from_json_text(older.dump(), "job"), doctest::Contains("'int4' is not f32, bf16, i8 or nf4"));

  const model_config cfg = testing::tiny_config({});
  const std::string key = join_key(o, cfg);
  CHECK(key == join_key(back, cfg));
  dist_train_options other = o;
  other.lora->seed = 1;
  CHECK(join_key(other, cfg) != key);
  other = o;
  other.lora->base_weights = weight_format::nf4;  // every rank holds the frozen blocks alike
  CHECK(join_key(other, cfg) != key);
  CHECK(checkpoint_key(other, cfg) == checkpoint_key(o, cfg));  // the adapter may go on beside another format
  other = o;
  other.lora->config.targets = {"self_attn.q_proj"};
  CHECK(join_key(other, cfg) != key);
  other.lora.reset();
  CHECK(join_key(other, cfg) != key);

  // Its checkpoints hold the adapter's blocks, and no head: another job
  // (the whole model, another adapter shape) does not resume them, the
  // same adapter from another seed or directory does.
  CHECK(checkpoint_key(other, cfg) != checkpoint_key(o, cfg));
  dist_train_options reseeded = o;
  reseeded.lora->seed = 7;
  reseeded.lora->from.clear();
  CHECK(checkpoint_key(reseeded, cfg) == checkpoint_key(o, cfg));
  reseeded.lora->config.alpha = 8.0f;
  CHECK(checkpoint_key(reseeded, cfg) != checkpoint_key(o, cfg));
  reseeded = o;
  reseeded.lora->base_digest = "0000000000000000";  // beside other frozen weights
  CHECK(checkpoint_key(reseeded, cfg) != checkpoint_key(o, cfg));
  reseeded = o;
  reseeded.lora->from = "/elsewhere/adapter";  // the same adapter at another path joins
  CHECK(join_key(reseeded, cfg) == key);
  reseeded.lora->from_digest = "1111111111111111";
  CHECK(join_key(reseeded, cfg) != key);
  CHECK(job_buckets(o, 2) == std::vector<std::string>{"block.0", "block.1"});
  CHECK(job_buckets(other, 2) == std::vector<std::string>{"head", "block.0", "block.1"});
  CHECK(trained_buckets(o, 0) == std::set<std::string>{"block.0", "block.1"});
  CHECK(trained_buckets(other, 0) == std::set<std::string>{"block.0", "block.1", "head"});
}
