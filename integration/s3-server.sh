#!/usr/bin/env bash
# A real S3 server on loopback for the tests and benchmarks: moto_server
# (installed with pip when missing), with credentials enforced.
#
#   integration/s3-server.sh start DIR   start it; DIR/s3.env gets the
#                                        UFS_TEST_S3_* variables to source
#   integration/s3-server.sh stop DIR    stop it
#
# The server (run through s3_server.py, which makes its signature check
# canonicalise query strings as AWS does) keeps objects in memory. It requires signed requests: the
# setup creates a user with an access key and the bucket `curvine-test`,
# so a wrong secret gets SignatureDoesNotMatch as from a real store.
set -euo pipefail

cmd=${1:?usage: s3-server.sh start|stop DIR}
dir=${2:?usage: s3-server.sh start|stop DIR}
mkdir -p "$dir"

case "$cmd" in
start)
    if ! command -v moto_server >/dev/null 2>&1 || ! python3 -c 'import boto3' 2>/dev/null; then
        echo "installing moto[server] (the test S3 server) with pip" >&2
        python3 -m pip install --quiet 'moto[server]>=5' >&2
    fi
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # The first four requests (the setup below) need no signature; every
    # later one must be signed with the key the setup creates.
    here=$(cd "$(dirname "$0")" && pwd)
    INITIAL_NO_AUTH_ACTION_COUNT=4 nohup python3 "$here/s3_server.py" -H 127.0.0.1 -p "$port" \
        >"$dir/s3-server.log" 2>&1 &
    echo $! >"$dir/s3-server.pid"
    for _ in $(seq 1 100); do
        if python3 -c "import socket; socket.create_connection(('127.0.0.1',$port),0.2)" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    python3 - "$port" >"$dir/s3.env" <<'PY'
import json, sys, boto3
port = sys.argv[1]
endpoint = f"http://127.0.0.1:{port}"
anon = dict(endpoint_url=endpoint, aws_access_key_id="setup", aws_secret_access_key="setup", region_name="us-east-1")
iam = boto3.client("iam", **anon)
iam.create_user(UserName="curvine")
iam.put_user_policy(UserName="curvine", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="curvine")["AccessKey"]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key["AccessKeyId"],
                  aws_secret_access_key=key["SecretAccessKey"], region_name="us-east-1")
s3.create_bucket(Bucket="curvine-test")
print(f"export UFS_TEST_S3_ENDPOINT={endpoint}")
print(f"export UFS_TEST_S3_ACCESS={key['AccessKeyId']}")
print(f"export UFS_TEST_S3_SECRET={key['SecretAccessKey']}")
print("export UFS_TEST_S3_BUCKET=curvine-test")
PY
    echo "S3 server (moto) on 127.0.0.1:$port, variables in $dir/s3.env" >&2
    ;;
stop)
    if [ -f "$dir/s3-server.pid" ]; then
        kill "$(cat "$dir/s3-server.pid")" 2>/dev/null || true
        rm -f "$dir/s3-server.pid"
    fi
    ;;
*)
    echo "usage: s3-server.sh start|stop DIR" >&2
    exit 2
    ;;
esac
