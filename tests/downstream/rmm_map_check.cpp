// One RMM per process, seen from a host program (a Python interpreter, a plugin host): loads
// librmm.so, then a cdylib built on raft, and compares the address of RMM's per-device map
// (rmm::mr::detail::get_ref_map()'s static) that librmm.so resolves with the one raft's shim
// uses inside the cdylib. Needs no GPU: the map is a plain C++ static.
//
//   rmm_map_check LIBRMM MAP_SYMBOL CDYLIB
//
// MAP_SYMBOL is the mangled name of the map (check.sh reads it from librmm.so's dynamic symbols):
// dlsym on librmm's handle gives librmm's own definition. Instantiating get_ref_map() in this
// program instead would give this program's copy, which tests the checker, not librmm.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

static void* open_or_exit(const char* path)
{
  // RTLD_LOCAL, as Python loads extension modules.
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "rmm_map_check: dlopen %s: %s\n", path, dlerror());
    std::exit(3);
  }
  return handle;
}

static const char* holder(const void* address)
{
  Dl_info info{};
  return (dladdr(address, &info) != 0 && info.dli_fname != nullptr) ? info.dli_fname : "?";
}

int main(int argc, char** argv)
{
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LIBRMM MAP_SYMBOL CDYLIB\n", argv[0]);
    return 3;
  }
  void* rmm   = open_or_exit(argv[1]);
  void* probe = open_or_exit(argv[3]);
  void* rmm_map = dlsym(rmm, argv[2]);
  if (rmm_map == nullptr) {
    std::fprintf(stderr, "rmm_map_check: %s is not in %s: %s\n", argv[2], argv[1], dlerror());
    return 3;
  }
  using probe_fn = std::uintptr_t (*)();
  auto probe_map = reinterpret_cast<probe_fn>(dlsym(probe, "probe_rmm_map_address"));
  if (probe_map == nullptr) {
    std::fprintf(stderr, "rmm_map_check: no probe_rmm_map_address in %s\n", argv[3]);
    return 3;
  }
  void* raft_map = reinterpret_cast<void*>(probe_map());
  std::printf("librmm.so's per-device map: %p (in %s)\n", rmm_map, holder(rmm_map));
  std::printf("raft's map, in the cdylib:  %p (in %s)\n", raft_map, raft_map ? holder(raft_map) : "-");
  if (raft_map == nullptr || raft_map != rmm_map) {
    std::printf("rmm_map_check: TWO per-device maps in one process\n");
    return 1;
  }
  std::printf("rmm_map_check: one per-device map\n");
  return 0;
}
