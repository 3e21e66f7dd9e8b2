// Drives the real, unmodified E2B SDK through file metadata (envd 0.6.2):
// X-Metadata-* headers on uploads kept as the files' user.e2b.* extended
// attributes and returned by write, getInfo, list and rename; an upload
// without them clears them. Usage as compat.mjs; run by
// internal/front/e2b's TestRealSDKMetadata.
import assert from 'node:assert/strict'

const mod = process.argv[2] || 'e2b'
const { Sandbox, InvalidArgumentError } = await import(mod)

function ok(name) { console.log(`ok ${mod} ${name}`) }

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  const want = { owner: 'alice', 'build-id': '42', note: 'a b=c; "d"' }
  let info = await sbx.files.write('/home/user/md/a.txt', 'hello', { metadata: { Owner: 'alice', 'build-id': '42', note: 'a b=c; "d"' } })
  assert.deepEqual(info.metadata, want)
  assert.deepEqual((await sbx.files.getInfo('/home/user/md/a.txt')).metadata, want)
  let list = await sbx.files.list('/home/user/md')
  assert.deepEqual(list.map((e) => [e.name, e.metadata]), [['a.txt', want]])
  assert.equal(await sbx.files.read('/home/user/md/a.txt'), 'hello')
  // Kept as extended attributes, read by anything in the sandbox.
  const r = await sbx.commands.run(`python3 -c "import os; print(sorted((k, os.getxattr('/home/user/md/a.txt', k).decode()) for k in os.listxattr('/home/user/md/a.txt')))"`)
  assert.equal(r.stdout, `[('user.e2b.build-id', '42'), ('user.e2b.note', 'a b=c; "d"'), ('user.e2b.owner', 'alice')]\n`)
  ok('files.write metadata: kept as user.e2b.* xattrs, returned by write, getInfo, list')

  // Several files in one upload (multipart) and an octet-stream one.
  const many = await sbx.files.write([{ path: '/home/user/md/b.txt', data: 'b' }, { path: '/home/user/md/c.txt', data: 'c' }], { metadata: { k: 'v' } })
  assert.deepEqual(many.map((e) => e.metadata), [{ k: 'v' }, { k: 'v' }])
  info = await sbx.files.write('/home/user/md/d.bin', new Blob([new Uint8Array(100).fill(1)]).stream(), { metadata: { stream: 'yes' } })
  assert.deepEqual(info.metadata, { stream: 'yes' })
  list = await sbx.files.list('/home/user/md')
  assert.deepEqual(list.map((e) => [e.name, e.metadata]), [['a.txt', want], ['b.txt', { k: 'v' }], ['c.txt', { k: 'v' }], ['d.bin', { stream: 'yes' }]])
  ok('metadata on multipart and octet-stream uploads')

  // An upload replaces the metadata; one without any clears it.
  info = await sbx.files.write('/home/user/md/a.txt', 'again', { metadata: { fresh: '1' } })
  assert.deepEqual((await sbx.files.getInfo('/home/user/md/a.txt')).metadata, { fresh: '1' })
  info = await sbx.files.write('/home/user/md/a.txt', 'plain')
  assert.equal(info.metadata, undefined)
  assert.equal((await sbx.files.getInfo('/home/user/md/a.txt')).metadata, undefined)
  ok('an upload replaces the metadata; without any it clears it')

  // Set out of band: user.e2b.* shows, other user.* does not; a rename keeps it.
  await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/md/b.txt', 'user.e2b.extra', b'x'); os.setxattr('/home/user/md/b.txt', 'user.other', b'y')"`)
  const moved = await sbx.files.rename('/home/user/md/b.txt', '/home/user/md/e.txt')
  assert.deepEqual(moved.metadata, { k: 'v', extra: 'x' })
  ok('metadata set in the sandbox shows; rename keeps it')

  // The watch's 0.6.x options: includeEntry gives each event the entry
  // (metadata included); allowNetworkMounts is taken (a clade sandbox has
  // no network mounts of its own to refuse).
  const events = []
  const w = await sbx.files.watchDir('/home/user/md', (ev) => { events.push(ev) }, { includeEntry: true, allowNetworkMounts: true })
  await sbx.files.write('/home/user/md/w.txt', 'watched', { metadata: { seen: 'yes' } })
  const end = Date.now() + 30_000
  while (!events.some((ev) => ev.name === 'w.txt' && ev.entry?.metadata?.seen === 'yes') && Date.now() < end) {
    await new Promise((res) => setTimeout(res, 100))
  }
  await w.stop()
  const ev = events.find((e) => e.name === 'w.txt' && e.entry?.metadata?.seen === 'yes')
  assert.ok(ev, JSON.stringify(events))
  assert.equal(ev.entry.path, '/home/user/md/w.txt')
  assert.equal(ev.entry.type, 'file')
  assert.equal(ev.entry.owner, 'user')
  ok('watchDir with includeEntry (the entry and its metadata) and allowNetworkMounts')

  // The SDK refuses what envd would; clade refuses it too (checked in Go).
  await assert.rejects(sbx.files.write('/home/user/md/x.txt', 'x', { metadata: { 'bad key': 'v' } }), InvalidArgumentError)
} finally {
  await sbx.kill()
}
console.log(`PASS ${mod}`)
