#!/usr/bin/env bash
# Prints the Debian packages that provide the shared libraries the given binaries load, one per
# line, so that the runtime image installs exactly those (Dockerfile, runtime stage).
#   deploy/docker/runtime-packages.sh build/bin/tokenselect ...
# Libraries no package owns (e.g. copied in by hand) are reported on stderr and exit status 1.
set -euo pipefail
status=0
declare -A packages=()
while read -r lib; do
  pkg=""
  # dpkg may record a library under /lib or /usr/lib (merged /usr): try the path as ldd gave
  # it, its real path, and both spellings.
  for candidate in "$lib" "$(realpath "$lib")" "${lib#/usr}" "/usr${lib}"; do
    if owner=$(dpkg -S "$candidate" 2>/dev/null); then
      pkg=${owner%%:*}
      break
    fi
  done
  if [[ -z $pkg ]]; then
    echo "runtime-packages: no package owns $lib" >&2
    status=1
  else
    packages[$pkg]=1
  fi
done < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
printf '%s\n' "${!packages[@]}" | sort
exit $status
