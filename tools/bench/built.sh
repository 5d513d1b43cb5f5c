# Sourced by the GPU pack scripts (gpu_pack.sh, gpu_tests.sh, gpu_speed.sh), from the
# repository root: `built ARGS...` builds the test binaries `cargo test ARGS... --no-run`
# names and prints "target-name path" for each executable, from cargo's own report of what
# it built (the paths carry hashes no script can guess).
built() {
  cargo test "$@" --no-run --message-format=json 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    j = json.loads(l)
    if j.get("reason") == "compiler-artifact" and j.get("executable"):
        print(j["target"]["name"], j["executable"])'
}
