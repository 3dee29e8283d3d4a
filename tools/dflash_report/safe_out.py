"""Writing the exports into a directory others may write to (a shared --out; issue 48 item 1).

Each export is written into a fresh staging directory made inside the target's parent (tempfile.mkdtemp:
an unpredictable name, mode 0700, created by mkdir, which never follows a planted link), through its
descriptor (os.open(..., dir_fd=) or /proc/self/fd/N for libraries that take a path: a rename or a link
swapped in mid-export cannot redirect it), and then renamed into place relative to the parent's
descriptor. A link or a non-directory at the target's name is refused, never followed; what is removed
(the previous export) is removed through descriptors (shutil.rmtree with dir_fd, which does not follow
links), so nothing a link points at is ever deleted. A tree written elsewhere (W&B's private directory,
tools/dflash_report/export.py write_wandb) is copied into a staged directory by copy_tree, through
descriptors as well. docs/metrics.md "The run directory" says the same.
"""

import os
import shutil
import stat
import tempfile

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Refused(OSError):
    """Something other than this tool's own directory or file sits at an export's name."""


def fd_path(fd, fallback):
    """A path naming the directory of descriptor fd for a library that wants a path: /proc/self/fd/N where
    the kernel shows it (it reopens that very directory), else the fallback path."""
    p = f"/proc/self/fd/{fd}"
    return p if os.path.isdir("/proc/self/fd") else fallback


def _parent(target):
    parent, name = os.path.split(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)), parent, name


def _check_dir_entry(pfd, name, target):
    """None when nothing is at name; 'dir' for a real directory; Refused otherwise."""
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{target} is a symbolic link: refused (the export would be written through it)")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{target} is not a directory: refused (move it away)")
    return "dir"


def refuse_non_directory(target):
    """Refused unless target is a real directory or absent: the early check before a slow export starts
    (StagedDir checks again when it stages and when it swaps in)."""
    pfd, _, name = _parent(target)
    try:
        _check_dir_entry(pfd, name, target)
    finally:
        os.close(pfd)


class StagedDir:
    """with StagedDir(target) as s: write into s.fd (os.open(name, ..., dir_fd=s.fd)) or s.path (a path for
    libraries); on a clean exit the staged directory takes target's place and the previous one is removed.
    s.old_fd: the previous directory (opened O_NOFOLLOW) or None, for what is to be carried over. Setting
    s.discard = True removes the staged directory instead (its entries were moved elsewhere)."""

    def __init__(self, target):
        self.target = target

    def __enter__(self):
        self.pfd, self.parent, self.name = _parent(self.target)
        self.discard = False
        try:
            had = _check_dir_entry(self.pfd, self.name, self.target)
            self.old_fd = os.open(self.name, DIR_FLAGS, dir_fd=self.pfd) if had else None
            stage = tempfile.mkdtemp(prefix=f".{self.name}.", dir=self.parent)
            self.stage_name = os.path.basename(stage)
            self.fd = os.open(self.stage_name, DIR_FLAGS, dir_fd=self.pfd)
        except BaseException:
            os.close(self.pfd)
            raise
        self.path = fd_path(self.fd, stage)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None and not self.discard:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(self.fd, 0o777 & ~umask)  # the mode a new directory would have (mkdtemp made it 0700)
                self._swap_in()
        finally:
            for fd in (self.fd, self.old_fd):
                if fd is not None:
                    os.close(fd)
            shutil.rmtree(self.stage_name, dir_fd=self.pfd, ignore_errors=True)
            os.close(self.pfd)
        return False

    def _swap_in(self):
        # Whatever is at the name now (checked again: it may have changed since __enter__) goes into a
        # fresh directory of ours, as an entry (a link is moved as a link, never followed), then the staged
        # one is renamed in; the previous one is then removed through descriptors.
        if _check_dir_entry(self.pfd, self.name, self.target):
            aside = os.path.basename(tempfile.mkdtemp(prefix=f".{self.name}.old.", dir=self.parent))
            try:
                os.rename(self.name, os.path.join(aside, "previous"), src_dir_fd=self.pfd, dst_dir_fd=self.pfd)
                os.rename(self.stage_name, self.name, src_dir_fd=self.pfd, dst_dir_fd=self.pfd)
            finally:
                shutil.rmtree(aside, dir_fd=self.pfd, ignore_errors=True)
        else:
            os.rename(self.stage_name, self.name, src_dir_fd=self.pfd, dst_dir_fd=self.pfd)


def write_file(dir_fd, name, write):
    """A new file name in the directory dir_fd (O_CREAT|O_EXCL|O_NOFOLLOW), filled by write(f)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666,
                 dir_fd=dir_fd)
    with os.fdopen(fd, "w", newline="") as f:
        write(f)


def replace_file(target, write):
    """target replaced by a new file filled by write(f): written under a random name next to it (O_EXCL),
    renamed over it relative to the parent's descriptor (a link at the name is replaced, never followed)."""
    pfd, parent, name = _parent(target)
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise Refused(f"{target} is a directory: refused")
        except FileNotFoundError:
            pass
        for _ in range(100):
            tmp = f".{name}.{os.urandom(6).hex()}"
            try:
                write_file(pfd, tmp, write)
                break
            except FileExistsError:
                continue
        try:
            os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            os.unlink(tmp, dir_fd=pfd)
            raise
    finally:
        os.close(pfd)


def link_file(name, st, src_fd, dst_fd):
    """copy_tree's way for a file that stays where it is (an earlier export carried over): a hard link."""
    os.link(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)


def copy_file(name, st, src_fd, dst_fd):
    """copy_tree's way for a file whose source goes away (another file system, a private directory): its
    bytes, its mode and its times, into a new file (O_EXCL|O_NOFOLLOW)."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=src_fd)
    try:
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                      st.st_mode & 0o777, dir_fd=dst_fd)
        with os.fdopen(src, "rb", closefd=False) as fin, os.fdopen(dst, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.utime(fout.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(src)


def copy_tree(src_fd, dst_fd, place_file, skip=()):
    """Every entry of the directory src_fd (but the names in skip) recreated in the directory dst_fd, both
    held by descriptor: directories made (mkdir, never through a link) and walked O_NOFOLLOW, symbolic links
    made anew with the same text (never followed), regular files placed by place_file (link_file or
    copy_file); anything else (a FIFO, a device) is left out. Returns the names made in dst_fd."""
    made = []
    for name in sorted(os.listdir(src_fd)):
        if name in skip:
            continue
        st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=dst_fd)
            sub_src = os.open(name, DIR_FLAGS, dir_fd=src_fd)
            try:
                sub_dst = os.open(name, DIR_FLAGS, dir_fd=dst_fd)
                try:
                    copy_tree(sub_src, sub_dst, place_file)
                    os.chmod(sub_dst, st.st_mode & 0o777)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
        elif stat.S_ISREG(st.st_mode):
            place_file(name, st, src_fd, dst_fd)
        else:
            continue
        made.append(name)
    return made
