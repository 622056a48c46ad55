#!/usr/bin/env python3
"""Names the samples `alloc-profile` wrote on the GPU machine (its OUT_DIR), with the same binaries
here: addr2line for the profiled binary and the shim (built with line tables), the library's file
name for everything else. Prints, per phase, where the samples fall: by function (the outermost
frame of an inlined chain), by innermost source line, and by library.

    scripts/symbolize-profile.py OUT_DIR BINARY SHIM_SO [TOP] [--insns]   (--insns: the hottest instructions too)
"""
import collections
import os
import subprocess
import sys


def load_maps(path):
    maps = []
    for line in open(path):
        parts = line.split()
        if len(parts) < 6 or 'x' not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split('-'))
        maps.append((lo, hi, int(parts[2], 16), parts[5]))
    return maps


def find(maps, addr):
    for lo, hi, off, path in maps:
        if lo <= addr < hi:
            return path, addr - lo + off
    return None, addr


def to_vaddr(binary):
    """A file offset of `binary` -> its address in the ELF (what addr2line reads), by PT_LOAD."""
    loads = []
    for line in subprocess.run(['readelf', '-lW', binary], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == 'LOAD':
            loads.append((int(parts[1], 16), int(parts[2], 16), int(parts[4], 16)))
    def convert(off):
        for p_off, p_vaddr, size in loads:
            if p_off <= off < p_off + size:
                return off - p_off + p_vaddr
        return off
    return convert


def addr2line(binary, offsets):
    """file offset -> (outermost function, innermost 'file:line function')"""
    convert = to_vaddr(binary)
    by_addr = {convert(o): o for o in set(offsets)}
    offsets = sorted(by_addr)
    if not offsets:
        return {}
    out = subprocess.run(['addr2line', '-f', '-i', '-C', '-a', '-e', binary] + [hex(o) for o in offsets],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    named, current, frames = {}, None, []

    def flush():
        if current is not None and frames:
            inner_fn, inner_loc = frames[0]
            named[by_addr.get(current, current)] = (frames[-1][0], f'{os.path.basename(inner_loc)} {inner_fn}')

    i = 0
    while i < len(out):
        line = out[i]
        if line.startswith('0x') and (i + 1 >= len(out) or not out[i + 1].startswith('0x')) and len(line) > 2 and all(c in '0123456789abcdefx' for c in line):
            flush()
            current, frames = int(line, 16), []
            i += 1
            continue
        fn = line
        loc = out[i + 1] if i + 1 < len(out) else '??'
        frames.append((fn[:110], loc))
        i += 2
    flush()
    return named


def instruction(binary, vaddr):
    """The instruction at `vaddr` of `binary`, as objdump writes it."""
    out = subprocess.run(['objdump', '-d', '--no-show-raw-insn', '-C', f'--start-address={vaddr}', f'--stop-address={vaddr + 16}', binary],
                         capture_output=True, text=True).stdout.splitlines()
    for line in out:
        if line.strip().startswith(f'{vaddr:x}:'):
            return ' '.join(line.split(':', 1)[1].split())
    return '?'


def hot_instructions(binary, offsets, n, top):
    """The `top` hottest instructions of the profiled binary: share, address, instruction, line."""
    convert = to_vaddr(binary)
    counts = collections.Counter(offsets)
    named = addr2line(binary, [o for o, _ in counts.most_common(top)])
    print('### hottest instructions of the binary (a sample names the instruction about to run)')
    for off, c in counts.most_common(top):
        va = convert(off)
        where = named.get(off, ('??', '??'))[1]
        print(f'{100.0 * c / n:5.1f}%  {va:#x}  {instruction(binary, va)[:60]:60}  {where[:90]}')


def main():
    insns = '--insns' in sys.argv
    args = [a for a in sys.argv[1:] if a != '--insns']
    d, binary, shim = args[0], args[1], args[2]
    top = int(args[3]) if len(args) > 3 else 25
    maps = load_maps(os.path.join(d, 'maps.txt'))
    print(open(os.path.join(d, 'summary.txt')).read())
    for name in sorted(f for f in os.listdir(d) if f.endswith('.txt') and f not in ('maps.txt', 'summary.txt')):
        addrs = [int(l, 16) for l in open(os.path.join(d, name)) if l.strip()]
        located = [find(maps, a) for a in addrs]
        local = {'bin': [], 'shim': []}
        for path, off in located:
            if path and path.endswith(os.path.basename(binary)):
                local['bin'].append(off)
            elif path and path.endswith('libraftrs_shim.so'):
                local['shim'].append(off)
        names = {('bin', o): v for o, v in addr2line(binary, local['bin']).items()}
        names.update({('shim', o): v for o, v in addr2line(shim, local['shim']).items()})
        by_fn, by_line, by_lib = collections.Counter(), collections.Counter(), collections.Counter()
        for path, off in located:
            lib = os.path.basename(path) if path else '?'
            by_lib[lib] += 1
            key = 'bin' if path and path.endswith(os.path.basename(binary)) else 'shim' if path and path.endswith('libraftrs_shim.so') else None
            if key:
                outer, inner = names.get((key, off), ('??', '??'))
                by_fn[f'[{key}] {outer}'] += 1
                by_line[f'[{key}] {inner}'] += 1
            else:
                by_fn[f'[{lib}]'] += 1
                by_line[f'[{lib}]'] += 1
        n = len(addrs)
        print(f'## {name[:-4]}: {n} samples')
        if insns:
            hot_instructions(binary, local['bin'], n, top)
        for title, counter in (('library', by_lib), ('function (outermost frame)', by_fn), ('innermost line', by_line)):
            print(f'### by {title}')
            for k, c in counter.most_common(top):
                print(f'{100.0 * c / n:5.1f}%  {k}')
        print()


if __name__ == '__main__':
    main()
