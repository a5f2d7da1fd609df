-- KEYS: md, mk; ARGV: namespace, key, expected_version ('' = any), value JSON ('' = tombstone)
-- -> new version, or nil when expected_version did not match
if ARGV[3] ~= '' and md_version(KEYS[1], ARGV[2]) ~= tonumber(ARGV[3]) then return false end
local value = ARGV[4]
if value == '' then value = false end
return md_write(KEYS[1], KEYS[2], ARGV[1], ARGV[2], value, now_ms())
