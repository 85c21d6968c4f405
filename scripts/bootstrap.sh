#!/usr/bin/env bash
# Makes this checkout runnable from nothing: Debian packages (ZooKeeper, a Java runtime for it and for
# Spark, Chromium for the status page's browser test) when we are root and $TEST_PACKAGES is not
# "no", then a virtualenv in .venv with the project and the extras named in $EXTRAS (default:
# test,dev; empty: the project alone). Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS-test,dev}
TEST_PACKAGES=${TEST_PACKAGES:-yes}

need_apt=()
if [ "$TEST_PACKAGES" != no ]; then
    [ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
    command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
    command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing Debian packages: ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "bootstrap: warning: missing ${need_apt[*]} and cannot apt-get (not root);" \
             "the ZooKeeper, Spark and status page browser tests will fail" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv"
    python3 -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)-${EXTRAS//,/-}
if [ ! -f "$stamp" ]; then
    echo "bootstrap: installing the project with extras [$EXTRAS]"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}"
    touch "$stamp"
fi
