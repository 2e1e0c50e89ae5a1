// The interoperability proof: GitHub's own attestation library (@actions/attest, behind
// actions/attest-build-provenance) signs an in-toto statement for argv[3] (sha256:HEX) named
// argv[4], with predicate type argv[5], against the mock services at argv[2] (serve.js): its
// requests to sigstore's public-good Fulcio and Rekor are answered by the mock through nock.
// The OIDC token comes from SIGSTORE_ID_TOKEN, as on a runner without ACTIONS_ID_TOKEN_*.
// Prints the sigstore bundle (JSON) on stdout; nothing is written to GitHub (skipWrite).
import { attest } from "@actions/attest";
import nock from "nock";

const [mockURL, digest, name, predicateType] = process.argv.slice(2);

function forward(origin, path) {
  nock(origin).persist().post(path).reply(async function (uri, body) {
    const response = await fetch(mockURL + uri, {
      method: "POST", body: typeof body === "string" ? body : JSON.stringify(body),
      headers: { "content-type": "application/json",
                 authorization: this.req.headers.authorization || "" } });
    return [response.status, await response.text(),
            { "content-type": response.headers.get("content-type") || "application/json" }];
  });
}

forward("https://fulcio.sigstore.dev", "/api/v2/signingCert");
forward("https://rekor.sigstore.dev", "/api/v1/log/entries");
const made = await attest({
  subjects: [{ name, digest: { sha256: digest.replace(/^sha256:/, "") } }],
  predicateType, predicate: {}, token: "unused", sigstore: "public-good", skipWrite: true });
process.stdout.write(JSON.stringify(made.bundle) + "\n");
