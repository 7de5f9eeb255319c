#!/usr/bin/env bash
# Installs the Debian packages shardlm builds and tests with, only those that are missing,
# so a second run costs a dpkg query. Needs root (or sudo) when something is missing.
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config
      libboost-program-options-dev nlohmann-json3-dev libgtest-dev
      libopenmpi-dev openmpi-bin python3 python3-numpy
      libpcre2-dev libicu-dev    # tokenizer: split regexes (PCRE2), Unicode normalization (ICU)
      libcpp-httplib-dev openssl # shardlm serve's HTTP(S) server; test_serve makes a certificate
      gnuplot-nox)               # bench/scaling.sh's plot

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
