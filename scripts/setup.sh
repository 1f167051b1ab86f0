#!/usr/bin/env bash
# Installs the Debian packages the build needs, when they are missing. Idempotent.
set -euo pipefail
packages=(libsqlite3-dev libsodium-dev libmicrohttpd-dev libcurl4-openssl-dev pkg-config openssl unison syncthing libpng-dev libturbojpeg0-dev tmux postgresql libpq-dev time man-db zsh fish)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v swift >/dev/null || { echo "setup: swift is not on PATH (Swift 6 toolchain required)" >&2; exit 1; }
