// The process's end as RMM's per-device map sees it: every touch of the map holds a shared
// lock, and an exit handler registered right after the map exists takes it exclusively and marks
// the map gone, so no touch runs against a dying map.
#include "memory.hpp"

#include <cstdlib>
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

void mark_map_gone() noexcept
{
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
