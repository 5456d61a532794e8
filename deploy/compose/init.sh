#!/usr/bin/env bash
# One-shot setup of the compose example (deploy/compose.yaml), run by its `init` service:
# secrets into /etc/kraft (shared read-only by the nodes), then `kraft storage format` of every
# node's data directory. Does nothing on a second run (the cluster keeps its secrets and data).
set -euo pipefail
etc=/etc/kraft
if [ -f "$etc/raft.secret" ]; then
  echo "already initialised"
  exit 0
fi
umask 077
rand() { openssl rand -base64 32 | tr -d '\n/+='; }
add_user() { KRAFT_RPC_PASSWORD=$3 python -m kraft.rpc.auth add-user --iterations 1000 "$1" "$2" >/dev/null; }
client_file() { printf 'username=%s\npassword=%s\n' "$2" "$3" >"$1"; }

openssl rand -base64 32 >"$etc/raft.secret"
controller_pw=$(rand) broker_pw=$(rand) admin_pw=$(rand) alice_pw=$(rand)
add_user "$etc/rpc-users" controller "$controller_pw"
add_user "$etc/rpc-users" broker "$broker_pw"
add_user "$etc/rpc-users" admin "$admin_pw"
add_user "$etc/sasl-users" broker "$broker_pw"
add_user "$etc/sasl-users" alice "$alice_pw"
client_file "$etc/controller.credentials" controller "$controller_pw"
client_file "$etc/broker.credentials" broker "$broker_pw"
client_file "$etc/admin.credentials" admin "$admin_pw"
client_file "$etc/alice.credentials" alice "$alice_pw"

mkdir -p "$etc/tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=kraft compose CA" \
  -keyout "$etc/tls/ca.key" -out "$etc/tls/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=kraft-broker" -keyout "$etc/tls/node.key" \
  -out "$etc/tls/node.csr" 2>/dev/null
printf 'subjectAltName=DNS:broker-1,DNS:broker-2,DNS:broker-3\n' >"$etc/tls/node.ext"
openssl x509 -req -in "$etc/tls/node.csr" -CA "$etc/tls/ca.pem" -CAkey "$etc/tls/ca.key" \
  -CAcreateserial -days 825 -extfile "$etc/tls/node.ext" -out "$etc/tls/node.pem" 2>/dev/null
rm -f "$etc/tls/ca.key" "$etc/tls/node.csr" "$etc/tls/node.ext"
# the nodes run as user kraft and only read these files
chown -R kraft:kraft "$etc" 2>/dev/null || true

for i in 1 2 3; do
  kraft storage format --config "/opt/pykraft/deploy/compose/controller-$i.properties" \
    --initial-controllers --ignore-formatted
  kraft storage format --config "/opt/pykraft/deploy/compose/broker-$i.properties" \
    --ignore-formatted
done
chown -R kraft:kraft /var/lib/kraft 2>/dev/null || true
echo "initialised"
