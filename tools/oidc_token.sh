#!/usr/bin/env bash
# The GitHub Actions job's OIDC token for audience `sigstore`, on stdout: what Fulcio certifies
# and what `builder publish` / `builder attest` read from SIGSTORE_ID_TOKEN (keyless signing,
# no private key). Needs the job's `id-token: write`, which makes the runner set
# ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN (the workflow rehearsal
# serves the same endpoint on loopback).
#   SIGSTORE_ID_TOKEN="$(tools/oidc_token.sh)"
set -euo pipefail
: "${ACTIONS_ID_TOKEN_REQUEST_URL:?no OIDC endpoint: the job needs permissions: id-token: write}"
: "${ACTIONS_ID_TOKEN_REQUEST_TOKEN:?no OIDC request token: the job needs id-token: write}"
curl -fsS --retry 3 -H "Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN" \
  "${ACTIONS_ID_TOKEN_REQUEST_URL}&audience=sigstore" | jq -er '.value'
