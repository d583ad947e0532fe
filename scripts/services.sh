#!/usr/bin/env bash
# Start the local services the test suite uses, when they are down and can be started
# here (the development machines have them installed; CI runs on such a machine).
set -u
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 60); do up "$1" && return 0; sleep 0.5; done; return 1; }

if ! up 6379 && command -v redis-server >/dev/null; then
  echo "starting redis"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log && wait_port 6379
fi
if ! up 5672 && command -v rabbitmq-server >/dev/null; then
  echo "starting rabbitmq"
  rabbitmq-server -detached && wait_port 5672
fi
if ! up 5432 && command -v pg_ctlcluster >/dev/null; then
  echo "starting postgresql"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start \
    && wait_port 5432
fi
if ! up 3306 && [ -x /usr/sbin/mariadbd ]; then
  echo "starting mariadb"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd && wait_port 3306
fi
# The dashboard's browser test drives Debian's Chromium (headless).
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium for the dashboard's browser test"
  apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "could not install chromium; the browser test will say so"
fi
exit 0
