// The process's end as RMM's per-device map sees it: every touch of the map holds a shared
// lock, and an exit handler registered right after the map exists takes it exclusively and marks
// the map gone, so no touch runs against a dying map.
#include "memory.hpp"

#include <atomic>
#include <cstdlib>
#include <unistd.h>
#include <stdexcept>

using namespace raftrs_shim;

namespace {

/// Every touch of RMM's per-device map holds this shared; the exit handler below takes it
/// exclusively and marks the map gone. Checking `rmm::process_is_exiting()` and then touching
/// the map was not atomic: another thread could pass the check while `exit` ran the handlers
/// and the map's destructor. Now a touch either ends before the map starts dying or is refused.
struct rmm_map_state {
  std::shared_mutex lock;
  bool gone{false};
};

rmm_map_state& map_state()
{
  static auto* s = new rmm_map_state{};  // never destroyed: used until the very end
  return *s;
}

/// The process that registered `mark_map_gone`: the child of a fork() inherits the handler and
/// the lock as another thread may have held it at the fork, never to be let go there; the
/// child, which may not use CUDA anyway, leaves it alone (the eighteenth audit).
std::atomic<pid_t> registered_by{0};

void mark_map_gone() noexcept
{
  if (getpid() != registered_by.load(std::memory_order_relaxed)) { return; }
  auto& s = map_state();
  std::unique_lock<std::shared_mutex> lock{s.lock};
  s.gone = true;
}

/// Registers `mark_map_gone` right after RMM's map (and RMM's own exit hook) exist: exit
/// handlers run in reverse order, so it runs before the map is destroyed. (A handler of this
/// library registered before it, the raft-exit hook in a process that made no map first, then
/// finds the map refused: its teardown is skipped, never run against a dying map.)
void register_map_exit()
{
  static bool const registered = [] {
    static_cast<void>(rmm::mr::detail::get_ref_map());
    registered_by.store(getpid(), std::memory_order_relaxed);
    return std::atexit(mark_map_gone) == 0;
  }();
  static_cast<void>(registered);
}

}  // namespace

namespace raftrs_shim __attribute__((visibility("hidden"))) {

rmm_map_use::rmm_map_use() : lock_{(register_map_exit(), map_state().lock)}
{
  if (map_state().gone || rmm::process_is_exiting()) {
    throw std::logic_error("RMM's per-device memory resources are gone: the process is exiting");
  }
}

}  // namespace raftrs_shim

extern "C" {

raftrs_status raftrs_rmm_map_address(void** out)
{
  return guard([&] {
    register_map_exit();  // the map exists from here on: its exit handler with it
    *out = static_cast<void*>(&rmm::mr::detail::get_ref_map());
  });
}

}  // extern "C"
