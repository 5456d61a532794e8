#!/usr/bin/env bash
# Generate every secret of the 3-host example (docs/deploy.md) on an admin machine:
#   OUT/hostN/etc/kraft/...   what to copy to host N's /etc/kraft (mode 0600 files)
#   OUT/admin/...             the operator's CLI credentials and kcat client config
# Needs openssl and python with pykraft importable (KRAFT_PYTHON, default python3).
# Usage: deploy/example/make-secrets.sh OUT
set -euo pipefail
out=${1:?usage: make-secrets.sh OUT}
py=${KRAFT_PYTHON:-python3}
hosts=(127.0.0.2 127.0.0.3 127.0.0.4)
umask 077
mkdir -p "$out/ca" "$out/admin"
rand() { openssl rand -base64 32 | tr -d '\n/+='; }
add_user() { # FILE NAME PASSWORD
  # random 256-bit passwords: no key stretching needed, so logins stay cheap
  KRAFT_RPC_PASSWORD=$3 "$py" -m kraft.rpc.auth add-user --iterations 1000 "$1" "$2" >/dev/null
}
client_file() { # FILE NAME PASSWORD
  printf 'username=%s\npassword=%s\n' "$2" "$3" >"$1"
}

# 1. the Raft secret: 32 random bytes, identical on every controller
raft_secret=$(openssl rand -base64 32)

# 2. a private CA and one certificate per host (its IP in subjectAltName)
openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=kraft example CA" \
  -keyout "$out/ca/ca.key" -out "$out/ca/ca.pem" 2>/dev/null
cp "$out/ca/ca.pem" "$out/admin/ca.pem"

# 3. passwords: controller RPC users (controller, broker, admin) and Kafka SASL users
controller_pw=$(rand) broker_pw=$(rand) admin_pw=$(rand) alice_pw=$(rand)
rm -f "$out/rpc-users" "$out/sasl-users"
add_user "$out/rpc-users" controller "$controller_pw"
add_user "$out/rpc-users" broker "$broker_pw"
add_user "$out/rpc-users" admin "$admin_pw"
add_user "$out/sasl-users" broker "$broker_pw"
add_user "$out/sasl-users" alice "$alice_pw"

for i in 1 2 3; do
  ip=${hosts[$((i - 1))]}
  etc="$out/host$i/etc/kraft"
  mkdir -p "$etc/tls"
  printf '%s\n' "$raft_secret" >"$etc/raft.secret"
  cp "$out/rpc-users" "$out/sasl-users" "$etc/"
  client_file "$etc/controller.credentials" controller "$controller_pw"
  client_file "$etc/broker.credentials" broker "$broker_pw"
  cp "$out/ca/ca.pem" "$etc/tls/ca.pem"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$ip" -keyout "$etc/tls/node.key" \
    -out "$etc/tls/node.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s\n' "$ip" >"$etc/tls/node.ext"
  openssl x509 -req -in "$etc/tls/node.csr" -CA "$out/ca/ca.pem" -CAkey "$out/ca/ca.key" \
    -CAcreateserial -days 825 -extfile "$etc/tls/node.ext" -out "$etc/tls/node.pem" 2>/dev/null
  rm -f "$etc/tls/node.csr" "$etc/tls/node.ext"
  mkdir -p "$out/host$i/var/lib/kraft" "$out/host$i/var/log/kraft"
done

client_file "$out/admin/admin.credentials" admin "$admin_pw"
cat >"$out/admin/kcat.conf" <<CONF
bootstrap.servers=127.0.0.2:9092,127.0.0.3:9092,127.0.0.4:9092
security.protocol=SASL_SSL
sasl.mechanisms=PLAIN
sasl.username=alice
sasl.password=$alice_pw
ssl.ca.location=$out/admin/ca.pem
CONF
echo "secrets written under $out (keep $out/ca/ca.key offline)"
