#!/bin/bash
# lcm-train-image (roles/train_image, docs/containers.md): the training environment as a squashfs image.
#   lcm-train-image key CONF          print the content key (sha256 of every input, one line)
#   lcm-train-image build CONF KEY    build <dir>/<name>-<key16>.sqsh unless it exists, link
#                                     <dir>/<name>.sqsh to it, keep the newest IMAGE_KEEP images
#   lcm-train-image list IMAGE        the paths inside an image (unsquashfs -l)
# The image is this node's root filesystem, restricted to IMAGE_PATHS and the venv, minus IMAGE_EXCLUDE
# (secrets, node identity, configuration mounted at run time). The key hashes the recipe (CONF), this
# tool, the installed packages (dpkg), the content, owners and modes of every copied file under etc/ (not
# their times: the image stamps IMAGE_EPOCH on every file) and the venv's file list with sizes and times:
# when none of them changed, the existing image is reused.
# Every file and the filesystem get the time IMAGE_EPOCH, so the same tree gives the same bytes.
# IMAGE_ROOT (environment, default /) is the root filesystem read; tests point it at a fake one.
set -euo pipefail
set -f  # IMAGE_EXCLUDE holds tar patterns: never expand them here

die() { echo "lcm-train-image: $*" >&2; exit 2; }
[[ $# -ge 2 ]] || die "usage: lcm-train-image key CONF | build CONF KEY | list IMAGE"
cmd=$1

if [[ $cmd == list ]]; then
    unsquashfs -l -d '' "$2" | sed -n 's,^/,,p'
    exit 0
fi

conf=$2
[[ -r $conf ]] || die "cannot read $conf"
# shellcheck source=/dev/null
source "$conf"
for v in IMAGE_DIR IMAGE_NAME IMAGE_VENV IMAGE_PATHS IMAGE_COMP IMAGE_EPOCH IMAGE_KEEP IMAGE_STAGE; do
    [[ -n ${!v:-} ]] || die "$conf does not set $v"
done
venv_rel=${IMAGE_VENV#/}
root=${IMAGE_ROOT:-/}
[[ -d $root ]] || die "IMAGE_ROOT $root is not a directory"

excludes=()
for pattern in ${IMAGE_EXCLUDE:-}; do
    excludes+=("--exclude=$pattern")
done

key() {
    {
        echo "recipe"; grep -v '^#' "$conf"
        echo "tool"; sha256sum < "$0"
        echo "packages"; dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${binary:Package}=${Version}\n' | LC_ALL=C sort
        echo "etc"
        # the files of etc/ that go in (same excludes as the build): content, owners, modes; every time is
        # IMAGE_EPOCH as in the image (a file replaced by rename moves etc/'s mtime, an excluded one too)
        tar -C "$root" --anchored --numeric-owner --sort=name --mtime="@$IMAGE_EPOCH" "${excludes[@]}" \
            -cf - etc | sha256sum
        echo "local"
        # files no package owns: usr/local (e.g. a source-built enroot), by content (same excludes)
        if [[ -d $root/usr/local ]]; then
            tar -C "$root" --anchored --numeric-owner --sort=name "${excludes[@]}" -cf - usr/local | sha256sum
        fi
        echo "venv"
        # files and links only, without __pycache__: Python writes bytecode there when a module first
        # runs, which changes nothing installed (a key over it, or over the directories' times, would
        # rebuild the image after every training run)
        (cd "$root" && find "$venv_rel" -name __pycache__ -prune -o ! -type d -printf '%P %s %T@ %m\n' | LC_ALL=C sort)
    } | sha256sum | cut -d' ' -f1
}

case $cmd in
key)
    key
    ;;
build)
    [[ $# -eq 3 && $3 =~ ^[0-9a-f]{64}$ ]] || die "build needs the 64-hex key from 'key'"
    want=$3
    short=${want:0:16}
    image="$IMAGE_DIR/$IMAGE_NAME-$short.sqsh"
    manifest="$IMAGE_DIR/$IMAGE_NAME-$short.json"
    link="$IMAGE_DIR/$IMAGE_NAME.sqsh"
    mkdir -p "$IMAGE_DIR"
    if [[ -s $image && -s $manifest ]]; then
        state="reused"
    else
        # the key again: the tree must not have moved between the caller's key and this build
        now=$(key)
        [[ $now == "$want" ]] || die "the inputs changed since the key was computed ($want -> $now); run again"
        start=$(date +%s.%N)
        mkdir -p "$IMAGE_STAGE"
        stage=$(mktemp -d "$IMAGE_STAGE/build.XXXXXX")
        trap 'rm -rf --one-file-system "$stage" "$image.tmp.$$" "$manifest.tmp.$$"' EXIT
        mkdir -p "$stage/root.fs"
        # the listed paths this root has (lib64 exists on amd64 Debian, not everywhere)
        paths=()
        for p in $IMAGE_PATHS; do
            [[ -e $root/$p || -L $root/$p ]] && paths+=("$p")
        done
        tar -C "$root" --anchored --numeric-owner "${excludes[@]}" -cf - "${paths[@]}" "$venv_rel" \
            | tar -C "$stage/root.fs" --numeric-owner -xpf -
        for d in ${IMAGE_DIRS:-}; do
            mkdir -p "$stage/root.fs/$d"
        done
        chmod 1777 "$stage/root.fs/tmp" "$stage/root.fs/var/tmp" 2>/dev/null || true
        mksquashfs "$stage/root.fs" "$image.tmp.$$" -noappend -comp "$IMAGE_COMP" -no-xattrs \
            -all-time "$IMAGE_EPOCH" -mkfs-time "$IMAGE_EPOCH" -quiet -no-progress >/dev/null
        sha=$(sha256sum "$image.tmp.$$" | cut -d' ' -f1)
        bytes=$(stat -c %s "$image.tmp.$$")
        files=$(find "$stage/root.fs" | wc -l)
        sync "$image.tmp.$$"
        mv -f "$image.tmp.$$" "$image"
        end=$(date +%s.%N)
        printf '{"key": "%s", "image": "%s", "sha256": "%s", "bytes": %s, "files": %s, "built_on": "%s", "build_s": %.1f, "compression": "%s", "epoch": %s}\n' \
            "$want" "$image" "$sha" "$bytes" "$files" "$(hostname)" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" \
            "$IMAGE_COMP" "$IMAGE_EPOCH" > "$manifest.tmp.$$"
        mv -f "$manifest.tmp.$$" "$manifest"
        state="built"
    fi
    # the link names the newest image; a running job keeps the file it opened
    ln -sfn "$(basename "$image")" "$link.tmp.$$"
    mv -fT "$link.tmp.$$" "$link"
    # retention: the newest IMAGE_KEEP images by manifest time, never the linked one; only this name's
    # <name>-<16 hex>.json (not <name>-other-...), globbed in the subshell (set -f holds here)
    hex16=$(printf '[0-9a-f]%.0s' {1..16})
    n=0
    # shellcheck disable=SC2086  # $hex16 is a glob pattern
    while read -r old; do
        n=$((n + 1))
        [[ $n -le $IMAGE_KEEP || $old == "$manifest" ]] && continue
        rm -f "${old%.json}.sqsh" "$old"
    done < <(set +f; ls -1t "$IMAGE_DIR/$IMAGE_NAME"-$hex16.json 2>/dev/null)
    echo "$state $image $(cat "$manifest")"
    ;;
*)
    die "unknown command $cmd"
    ;;
esac
