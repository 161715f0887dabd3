// Encodes every string of a JSON array with the npm gpt-3-encoder package
// (an independent GPT-2 BPE implementation) and prints the id arrays as JSON.
// Usage: node gpt2_reference.js NODE_MODULES_DIR STRINGS_JSON
const path = require('path');
const fs = require('fs');
const enc = require(path.join(process.argv[2], 'gpt-3-encoder'));
const strings = JSON.parse(fs.readFileSync(process.argv[3], 'utf-8'));
process.stdout.write(JSON.stringify(strings.map((s) => enc.encode(s))) + '\n');
