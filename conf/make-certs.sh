#!/usr/bin/env bash
# Makes the certificates for TLS between curvine nodes and clients (the
# [tls] section of curvine.toml) with openssl:
#
#   conf/make-certs.sh DIR [--name NAME] [--days N] HOST [HOST...]
#
# DIR/ca.pem and DIR/ca.key: the cluster's certificate authority, made on
# the first run and reused after (keep ca.key off the nodes). Each run then
# makes DIR/NAME.pem and DIR/NAME.key (NAME defaults to "node"): a
# certificate the CA signs for the given hosts (IP addresses or DNS names:
# the addresses nodes and clients reach this node by), usable both as a
# server and as a client (nodes present it to each other). A node is then
# configured with
#
#   tls.enabled = true, tls.ca = DIR/ca.pem, tls.cert = DIR/NAME.pem,
#   tls.key = DIR/NAME.key
#
# and a client with tls.enabled = true and tls.ca = DIR/ca.pem.
set -euo pipefail

usage() {
  echo "usage: $0 DIR [--name NAME] [--days N] HOST [HOST...]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
dir=$1
shift
name=node
days=825
hosts=()
while [ $# -gt 0 ]; do
  case $1 in
    --name) [ $# -ge 2 ] || usage; name=$2; shift 2 ;;
    --days) [ $# -ge 2 ] || usage; days=$2; shift 2 ;;
    -*) usage ;;
    *) hosts+=("$1"); shift ;;
  esac
done
[ "${#hosts[@]}" -gt 0 ] || { echo "$0: name at least one host the node is reached by" >&2; usage; }
case $name in
  ca | */* | "") echo "$0: --name must be a plain file name other than 'ca'" >&2; exit 2 ;;
esac
command -v openssl >/dev/null || { echo "$0: openssl is needed (Debian: apt-get install openssl)" >&2; exit 1; }

mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" -subj "/CN=curvine cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  chmod 644 "$dir/ca.pem"
  echo "made $dir/ca.pem (certificate authority; its key is $dir/ca.key)"
fi

san=""
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then
    san+="IP:$h,"
  else
    san+="DNS:$h,"
  fi
done
ext=$(mktemp)
csr=$(mktemp)
trap 'rm -f "$ext" "$csr"' EXIT
cat >"$ext" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = ${san%,}
EOF
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/$name.key" -out "$csr" -subj "/CN=$name" 2>/dev/null
openssl x509 -req -in "$csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
  -out "$dir/$name.pem" -days "$days" -extfile "$ext" 2>/dev/null
chmod 644 "$dir/$name.pem"
echo "made $dir/$name.pem and $dir/$name.key for ${hosts[*]}"
