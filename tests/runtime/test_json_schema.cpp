// Structured output (runtime/json_schema.h, runtime/json_mode.h): the schema compiler's refusals,
// the acceptor on texts of schemas, and random generations through the vocabulary masks checked
// by a plain validator written here from the JSON Schema rules (not from the acceptor).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/json_mode.h"
#include "runtime/json_schema.h"

using namespace shardlm;
using json = nlohmann::json;

namespace {
std::shared_ptr<const JsonSchema> schema(const std::string& text) {
    return std::make_shared<const JsonSchema>(compile_json_schema(text, "test"));
}
// How far `text` is taken under the schema: its length when all of it.
size_t taken(const std::string& schema_text, const std::string& text) {
    JsonAcceptor a(schema(schema_text));
    for (size_t i = 0; i < text.size(); ++i)
        if (!a.push(uint8_t(text[i]))) return i;
    return text.size();
}
bool complete(const std::string& schema_text, const std::string& text) {
    JsonAcceptor a(schema(schema_text));
    return a.push(text) && a.complete();
}
std::string error_of(const std::string& schema_text) {
    try {
        compile_json_schema(schema_text, "--json-schema s.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Characters of a UTF-8 string (JSON Schema counts code points).
int64_t code_points(const std::string& s) {
    int64_t n = 0;
    for (const char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
    return n;
}
// Whether v is valid against schema s (root: the document, for $ref): the keywords this
// project supports, by the JSON Schema rules.
bool valid(const json& v, const json& s, const json& root) {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) return valid(v, root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1))), root);
    if (s.contains("allOf"))
        for (const json& a : s["allOf"])
            if (!valid(v, a, root)) return false;
    if (s.contains("anyOf")) {
        bool any = false;
        for (const json& a : s["anyOf"]) any = any || valid(v, a, root);
        if (!any) return false;
    }
    if (v.is_number()) {
        const double x = v.get<double>();
        if ((s.contains("minimum") && x < s["minimum"].get<double>()) || (s.contains("maximum") && x > s["maximum"].get<double>()) ||
            (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) ||
            (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()))
            return false;
        if (s.contains("multipleOf") && std::fabs(std::remainder(x, s["multipleOf"].get<double>())) > 1e-9) return false;
    }
    if (s.contains("oneOf")) {  // exactly one
        int matched = 0;
        for (const json& a : s["oneOf"]) matched += valid(v, a, root);
        if (matched != 1) return false;
    }
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
    if (s.contains("const") && v != s["const"]) return false;
    if (s.contains("type")) {
        const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
        bool ok = false;
        for (const json& t : types) {
            const std::string n = t;
            ok = ok || (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
                 (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
                 // (an integer past 64 bits parses as a double: integral all the same)
                 (n == "integer" && (v.is_number_integer() ||
                                     (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))) ||
                 (n == "boolean" && v.is_boolean()) ||
                 (n == "null" && v.is_null());
        }
        if (!ok) return false;
    }
    if (v.is_object()) {
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (s.contains("properties") && s["properties"].contains(it.key())) {
                if (!valid(it.value(), s["properties"][it.key()], root)) return false;
            } else if (s.contains("additionalProperties") && !valid(it.value(), s["additionalProperties"], root)) {
                return false;
            }
        }
        if (s.contains("required"))
            for (const json& r : s["required"])
                if (!v.contains(r.get<std::string>())) return false;
    }
    if (v.is_array()) {
        // prefixItems: the first items' schemas; items: the rest's (false: none).
        const size_t tuple = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
        for (size_t i = 0; i < v.size(); ++i) {
            if (i < tuple && !valid(v[i], s["prefixItems"][i], root)) return false;
            if (i >= tuple && s.contains("items") && (s["items"] == json(false) || !valid(v[i], s["items"], root))) return false;
        }
        if (s.contains("minItems") && int64_t(v.size()) < s["minItems"].get<int64_t>()) return false;
        if (s.contains("maxItems") && int64_t(v.size()) > s["maxItems"].get<int64_t>()) return false;
    }
    if (v.is_string()) {
        const int64_t n = code_points(v.get<std::string>());
        if (s.contains("minLength") && n < s["minLength"].get<int64_t>()) return false;
        if (s.contains("maxLength") && n > s["maxLength"].get<int64_t>()) return false;
        // pattern, and format as shardlm spells it, by std::regex (ECMAScript; the texts here are ASCII).
        for (const std::string& re : {s.value("pattern", std::string()), s.contains("format") ? format_pattern(s["format"]) : ""})
            if (!re.empty() && !std::regex_search(v.get<std::string>(), std::regex(re, std::regex::ECMAScript))) return false;
    }
    return true;
}

// A random walk from `s`: at each step the vocabulary's mask must equal each token's own push,
// and some token must go on; then a token is drawn (after `eager` steps, one that closes a string
// or container two times in three). Stops when the value is complete or after `steps` tokens;
// returns the text (a failure is reported, and the walk ends, where the mask is wrong or stuck).
std::string random_walk(JsonVocab& v, const std::vector<std::string>& vocab, JsonAcceptor& s, std::mt19937& rng,
                        int steps, int eager, const std::string& what, int64_t& checked) {
    std::string text;
    for (int step = 0; step < steps && !s.complete(); ++step) {
        const std::vector<uint8_t>& mask = v.allowed(s);
        std::vector<int32_t> ok, closing;
        for (size_t id = 0; id < vocab.size(); ++id) {
            JsonAcceptor t = s;
            const bool want = !vocab[id].empty() && t.push(vocab[id]);
            ++checked;
            if ((mask[id] != 0) != want) {
                ADD_FAILURE() << what << "\ntoken " << id << " (" << vocab[id] << ") after " << text;
                return text;
            }
            if (!want) continue;
            ok.push_back(int32_t(id));
            if (vocab[id].find_first_of("\"]}") != std::string::npos) closing.push_back(int32_t(id));
        }
        if (ok.empty()) {
            ADD_FAILURE() << what << "\nstuck after " << text;
            return text;
        }
        const std::vector<int32_t>& from = step > eager && !closing.empty() && rng() % 3 != 0 ? closing : ok;
        const int32_t pick = from[size_t(rng() % from.size())];
        EXPECT_TRUE(s.push(vocab[size_t(pick)]));
        text += vocab[size_t(pick)];
    }
    return text;
}

// A complete text as JSON; false for a number past a double (valid JSON, drawn at random with a
// long exponent, which nlohmann refuses).
bool parsed(const std::string& text, json& value) {
    try {
        value = json::parse(text);
        return true;
    } catch (const json::out_of_range&) {
        return false;
    }
}

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 2, "maxLength": 5},
    "age": {"type": "integer"},
    "email": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 7, null]}, "minItems": 1, "maxItems": 3},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "tags"],
  "additionalProperties": false
})";
}  // namespace

TEST(JsonSchema, RefusesWhatItCannotHoldGenerationTo) {
    EXPECT_NE(error_of(R"j({"type": "string", "pattern": "a(?=b)"})j").find("--json-schema s.json: json_schema at #/pattern: "
                                                                           "lookahead and lookbehind"),
              std::string::npos) << error_of(R"j({"type": "string", "pattern": "a(?=b)"})j");
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"a": {"type": "string", "format": "iri"}}})")
                  .find("at #/properties/a/format: format \"iri\" is not supported"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "string", "pattern": "^a{5}$", "maxLength": 3})").find("no string of the pattern has 0 to 3 characters"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "string", "format": "uuid", "minLength": 40})").find("no string of the format has 40 or more characters"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "string", "pattern": 7})").find("#/pattern: must be a string"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"n": {"type": "number", "maximum": "1"}}})").find("#/properties/n/maximum: must be a number"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 2}}}})").find("\"not\""),
              std::string::npos);
    // oneOf where a value may match two alternatives (the second object is also the first's).
    EXPECT_NE(error_of(R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {"type": "integer"}}}]})")
                  .find("#/oneOf: alternatives 0 and 1 may both match a value"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"enum": [1, "x"]}]}}})")
                  .find("#/properties/v/oneOf: alternatives 0 and 1"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})")
                  .find("may both match"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "number"})").find("the top value must end by itself"), std::string::npos);
    EXPECT_NE(error_of(R"({"anyOf": [{"type": "object"}, {"type": "integer"}]})").find("must end by itself"), std::string::npos);
    EXPECT_NE(error_of(R"({"$ref": "#/$defs/nope"})").find("\"#/$defs/nope\" points at nothing"), std::string::npos);
    EXPECT_NE(error_of(R"({"$ref": "http://x/y.json"})").find("only references within the schema"), std::string::npos);
    EXPECT_NE(error_of(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})")
                  .find("refers back to itself before any value starts"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}, "required": ["k"]}},
                          "$ref": "#/$defs/n"})").find("no finite value fits the schema"),
              std::string::npos);
    EXPECT_NE(error_of("false").find("allows no value"), std::string::npos);
    EXPECT_NE(error_of("true").find("must end by itself"), std::string::npos);  // any value: a number too
    EXPECT_NE(error_of(R"({"type": "object", "required": ["x"], "additionalProperties": false})").find("\"x\" is required but not a property"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "minItems": 3, "maxItems": 2})").find("maxItems is below minItems"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "items": [{"type": "string"}]})").find("tuple items"), std::string::npos);
    EXPECT_NE(error_of(R"({"allOf": [{"type": "object"}, {"type": "object"}]})").find("allOf of one schema"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "string", "enum": [1, 2]})").find("no enum or const value has the schema's type"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "strin"})").find("#/type: must be one of"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "minItems": -1})").find("#/minItems: must be a non-negative integer"), std::string::npos);
    EXPECT_NE(error_of(R"({"$ref": "#", "type": "object"})").find("\"type\" beside \"$ref\""), std::string::npos);
    EXPECT_NE(error_of("{\"type\": ").find("--json-schema s.json: the JSON schema is not JSON"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "uniqueItems": true})").find("uniqueItems: only false"), std::string::npos);
    // Sizes: counts no context reaches (a maximum is then no limit), nesting, anyOf depth.
    EXPECT_EQ(error_of(R"({"type": "array", "items": {"type": "string", "maxLength": 1099511627776}})"), "");
    EXPECT_NE(error_of(R"({"type": "string", "minLength": 1099511627776})").find("#/minLength: more than 1073741824 can never be generated"),
              std::string::npos);
    std::string nested = R"({"type": "null"})", deep = R"({"type": "null"})";
    for (int i = 0; i < 70; ++i) nested = R"({"anyOf": [)" + nested + R"(, {"type": "string"}]})";
    for (int i = 0; i < 140; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"a": )" + nested + "}}").find("anyOf nested more than 64 deep"),
              std::string::npos);
    EXPECT_NE(error_of(deep).find("nested deeper than 128"), std::string::npos);
    // A long chain of $refs, each compiled within the depth limit (the later ones first): the
    // acceptor goes straight to the object at its end.
    std::string defs, refs;
    for (int i = 0; i < 2000; ++i)
        defs += cat(i ? ", " : "", "\"d", i, "\": ", i + 1 < 2000 ? cat(R"({"$ref": "#/$defs/d)", i + 1, "\"}") : R"({"type": "object"})");
    for (int i = 1900; i >= 0; i -= 100) refs += cat(i < 1900 ? ", " : "", R"({"$ref": "#/$defs/d)", i, "\"}");
    const std::string chain = R"({"$defs": {)" + defs + R"(}, "anyOf": [)" + refs + "]}";
    EXPECT_EQ(error_of(chain), "");
    EXPECT_TRUE(complete(chain, R"({"a": [1]})"));
    // Readings: two alike alternatives nested double them at each level; past 64 at once the
    // byte is refused (the 7th level's "{": 128).
    const char* twins = R"({"$defs": {"t": {"anyOf": [{"type": "object", "properties": {"a": {"$ref": "#/$defs/t"}}},
                           {"type": "object", "properties": {"a": {"$ref": "#/$defs/t"}}, "title": "twin"}]}},
                           "$ref": "#/$defs/t"})";
    std::string levels;
    for (int i = 0; i < 8; ++i) levels += R"({"a":)";
    EXPECT_EQ(taken(twins, levels), 30u);
    // Annotations are fine, and so is a schema that refers to itself through a value.
    EXPECT_EQ(error_of(R"({"title": "T", "description": "d", "$schema": "x", "type": "object", "examples": [{}],
                          "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}})"),
              "");
}

// prefixItems (a tuple): each of the first items its own schema, then items' (false: none).
TEST(JsonSchema, TupleItems) {
    const std::string pair = R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2,
                                 "maxItems": 2})";
    EXPECT_TRUE(complete(pair, R"([1, "ab"])"));
    EXPECT_EQ(taken(pair, R"([1, 2])"), 4u);
    EXPECT_EQ(taken(pair, R"(["a", 1])"), 1u);
    EXPECT_EQ(taken(pair, R"([1])"), 2u);  // two items
    EXPECT_EQ(taken(pair, R"([1, "a", 3])"), 7u);
    const std::string open = R"({"prefixItems": [{"const": "x"}], "items": {"type": "boolean"}})";
    EXPECT_TRUE(complete(open, R"(["x", true, false])"));
    EXPECT_TRUE(complete(open, R"([])"));
    EXPECT_EQ(taken(open, R"(["x", "x"])"), 6u);
    const std::string shut = R"({"type": "array", "prefixItems": [{"const": 1}, {"const": 2}], "items": false})";
    EXPECT_TRUE(complete(shut, "[1, 2]"));
    EXPECT_TRUE(complete(shut, "[1]"));
    EXPECT_EQ(taken(shut, "[1, 2, "), 5u);
    EXPECT_NE(error_of(R"({"type": "array", "items": [{"type": "integer"}]})").find("#/items: an array of schemas (draft 7's tuple items)"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "prefixItems": {"type": "integer"}})").find("#/prefixItems: must be an array of schemas"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "prefixItems": [true], "items": false, "minItems": 2})").find("minItems 2 is past the 1 prefixItems"),
              std::string::npos);
    // A tuple item that can never end (refers back to its own array without end) caps the items before it.
    const std::string self = R"({"$defs": {"A": {"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#/$defs/B"}]},
        "B": {"type": "array", "prefixItems": [{"$ref": "#/$defs/B"}], "minItems": 1}}, "$ref": "#/$defs/A"})";
    EXPECT_TRUE(complete(self, "[1]"));
    EXPECT_EQ(taken(self, "[1, "), 2u);
}

TEST(JsonSchema, HoldsTheTextToTheSchema) {
    const std::string full = R"({"name": "Bo", "age": -3, "email": null, "tags": ["a", 7, null], "ok": true})";
    EXPECT_TRUE(complete(kPerson, full));
    EXPECT_TRUE(complete(kPerson, R"({"name":"Ann","tags":["b"]})"));      // optional keys skipped
    EXPECT_TRUE(complete(kPerson, R"({"name": "Ann", "email": "x@y", "tags": [null]})"));
    for (size_t n = 0; n < full.size(); ++n) {  // every prefix is taken, none is complete
        JsonAcceptor a(schema(kPerson));
        EXPECT_TRUE(a.push(full.substr(0, n))) << n;
        EXPECT_FALSE(a.complete()) << n;
    }
    EXPECT_EQ(taken(kPerson, R"({"tags": ["a"]})"), 2u);          // "name" is required first
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann"})"), 14u);         // "tags" is required: no '}'
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "tags": ["a"], "age": 3})"), 32u);  // keys in the schema's order
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "x": 1})"), 17u);  // no other keys
    EXPECT_EQ(taken(kPerson, R"({"name": "A"})"), 11u);           // minLength 2
    EXPECT_EQ(taken(kPerson, R"({"name": "Annabel"})"), 15u);     // maxLength 5
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "age": 1.5})"), 24u);  // an integer has no fraction
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "age": 1e3})"), 24u);  // ... nor exponent
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "age": "3"})"), 23u);
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "email": 5})"), 25u);
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "tags": []})"), 25u);  // minItems 1
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "tags": [7, 7, 7, 7]})"), 32u);  // maxItems 3
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "tags": ["c"]})"), 26u);  // enum
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "tags": [77]})"), 26u);
    EXPECT_EQ(taken(kPerson, R"({"name": "Ann", "tags": ["a"], "ok": 1})"), 37u);
    // Characters, not bytes: two 2-byte characters, an escape, a surrogate pair (one character).
    EXPECT_TRUE(complete(kPerson, "{\"name\": \"\xc3\xa9\xc3\xa9\\n\\ud83d\\ude00\", \"tags\": [\"a\"]}"));
    EXPECT_EQ(taken(kPerson, "{\"name\": \"\\ude00\"}"), 13u);        // a low surrogate alone (at "de": every such value is one)
    EXPECT_EQ(taken(kPerson, "{\"name\": \"\\ud83dx\"}"), 16u);       // a high one without its low half
    EXPECT_EQ(taken(kPerson, "{\"name\": \"ab\\ud83d\\u0041\"}"), 20u);  // a low half due: "0" cannot begin one
    EXPECT_EQ(taken(kPerson, "{\"name\": \"ab\\ud83d\\udb00\"}"), 21u);
    EXPECT_TRUE(complete(kPerson, "{\"name\": \"\\ud7ff\\ue000\", \"tags\": [7]}"));  // around the surrogates
    // Choices that could never finish are taken out: an anyOf alternative and an optional property
    // whose object requires itself without end.
    const char* endless = R"({"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/inf"}, {"type": "string"}]},
                            "b": {"$ref": "#/$defs/inf"}}, "$defs": {"inf": {"type": "object",
                            "properties": {"k": {"$ref": "#/$defs/inf"}}, "required": ["k"]}}})";
    EXPECT_TRUE(complete(endless, R"({"a": "x"})"));
    EXPECT_EQ(taken(endless, R"({"a": {"k": {)"), 6u);
    EXPECT_EQ(taken(endless, R"({"a": "x", "b": {"k": {)"), 9u);
    EXPECT_EQ(taken(endless, R"({"b": {)"), 2u);
    // A map: free keys whose values follow additionalProperties; and numbers in an enum that
    // share their start ("1" and "12": what follows tells where the number ended).
    const char* map = R"({"type": "object", "additionalProperties": {"enum": [1, 12, 2.5]}})";
    EXPECT_TRUE(complete(map, R"({"x": 1, "y": 12, "z": 2.5})"));
    EXPECT_TRUE(complete(map, R"({})"));
    EXPECT_EQ(taken(map, R"({"x": 13})"), 7u);
    EXPECT_EQ(taken(map, R"({"x": 2})"), 7u);
    // A recursive schema through $defs, and the top value an array or a string.
    const char* tree = R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
                            "$ref": "#/$defs/node"})";
    EXPECT_TRUE(complete(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
    EXPECT_EQ(taken(tree, R"({"v": 1, "kids": [{}]})"), 19u);
    EXPECT_TRUE(complete(R"({"type": "array", "items": {"type": "number"}})", "[1, -0.5e-3]"));
    EXPECT_TRUE(complete(R"({"type": "string", "maxLength": 0})", "\"\""));
    EXPECT_TRUE(complete(R"({"enum": ["red", "green"]})", "\"green\""));
    EXPECT_EQ(taken(R"({"enum": ["red", "green"]})", "\"grey\""), 4u);
    EXPECT_TRUE(complete(R"({"const": {"a": [1, true]}})", R"({"a":[1,true]})"));  // enum values as compact JSON
    EXPECT_TRUE(complete(R"({"type": ["array", "object"]})", R"([{"x": null}, 1, "y"])"));  // items of any type
    // Whitespace: at most max_space bytes in a row, one line break among them; 0: compact.
    JsonSchema compact = compile_json_schema(kPerson, "test");
    compact.max_space = 0;
    JsonAcceptor c(std::make_shared<const JsonSchema>(compact));
    EXPECT_TRUE(c.push(std::string(R"({"name":"A b",)")));
    EXPECT_FALSE(c.push(' '));
    EXPECT_FALSE(c.push('\n'));
    EXPECT_TRUE(c.push(std::string(R"("tags":["a"]})")));
    EXPECT_TRUE(c.complete());
    const std::string sixteen(16, ' ');
    EXPECT_EQ(taken(kPerson, "{" + sixteen + " \"name\""), 17u);
    EXPECT_EQ(taken(kPerson, "{\n  \"name\":\n \"Ab\""), 17u);  // a line break in each gap
    EXPECT_EQ(taken(kPerson, "{\n \n\"name\""), 3u);            // one per gap
}

// vLLM's guided_choice: the text is one of the choices, raw; one that begins another is refused.
TEST(JsonSchema, ChoicesAreTakenWhole) {
    const auto sc = std::make_shared<const JsonSchema>(choice_schema({"yes", "no", "maybe so", "no"}, "guided_choice"));
    for (const std::string c : {"yes", "no", "maybe so"}) {
        JsonAcceptor a(sc);
        EXPECT_TRUE(a.push(c)) << c;
        EXPECT_TRUE(a.complete()) << c;
        EXPECT_FALSE(a.push(' ')) << c;
    }
    JsonAcceptor a(sc);
    EXPECT_TRUE(a.push(std::string("may")));
    EXPECT_FALSE(a.complete());
    EXPECT_FALSE(a.push('x'));
    auto error = [](std::vector<std::string> c) {
        try {
            choice_schema(std::move(c), "guided_choice");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_EQ(error({"no", "yes", "nope"}), "guided_choice: \"no\" begins \"nope\" (the text could not tell where it ends)");
    EXPECT_EQ(error({}), "guided_choice: no choices");
    EXPECT_EQ(error({"a", ""}), "guided_choice: a choice is empty");
}

// Random texts of several schemas, each token drawn among those the vocabulary mask allows:
// every mask equals what pushing each token says, the text never gets stuck, and each completed
// text is valid against its schema by the validator above.
TEST(JsonSchema, MaskedGenerationIsValidAgainstTheSchema) {
    const std::vector<std::string> schemas = {
        kPerson,
        R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}},
           "required": ["x"]}, {"type": "object", "properties": {"y": {"type": "boolean"}}}, {"type": "null"}]},
           "b": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}}},
           "required": ["a", "b"]})",
        R"({"type": "object", "additionalProperties": {"type": "array", "items": {"enum": [1, 12, 123, "x", {"k": 1}]}}})",
        R"({"$defs": {"n": {"type": "object", "properties": {"v": {"type": "number"}, "k": {"type": "array",
           "items": {"$ref": "#/$defs/n"}, "maxItems": 2}}, "required": ["v"]}}, "$ref": "#/$defs/n"})",
        R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 4},
           "t": {"type": ["string", "integer", "null"]}}, "required": ["s"]})",
        R"({"type": "object"})",
        // oneOf: a discriminated union (Pydantic's, with its discriminator annotation) and types apart.
        R"({"$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
           "required": ["kind"]}, "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
           "required": ["kind", "good"]}}, "type": "object", "properties": {"pet": {"oneOf": [{"$ref": "#/$defs/Cat"},
           {"$ref": "#/$defs/Dog"}], "discriminator": {"propertyName": "kind"}}, "n": {"oneOf": [{"type": "string"},
           {"type": "integer"}, {"enum": [true, null]}]}}, "required": ["pet", "n"]})",
        // Integers in bounds (a number left free beside them).
        R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 12, "maximum": 345},
           "b": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": -3}, "maxItems": 3},
           "c": {"type": "number"}}, "required": ["a", "b"]})",
        // Tuples (Pydantic's tuple[int, str] and tuple[bool, ...] with items after the prefix).
        R"({"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{"type": "integer"},
           {"type": "string", "maxLength": 3}], "minItems": 2, "maxItems": 2}, "open": {"prefixItems": [{"enum": ["a", "b"]}],
           "items": {"type": "boolean"}, "maxItems": 4}, "shut": {"type": "array", "prefixItems": [{"const": 1}, {"const": 2}],
           "items": false}}, "required": ["pair", "open", "shut"]})",
        // Multiples (with bounds or alone), and a string of a pattern and a format at once.
        R"({"type": "object", "properties": {"m": {"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 50},
           "h": {"type": "number", "multipleOf": 0.5}, "id": {"type": "string", "format": "uuid", "pattern": "^0"}},
           "required": ["m", "h", "id"]})",
        // Numbers in bounds (Pydantic's Field(ge=0, le=1), confloat(gt=-2.5, lt=-0.125)).
        R"({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
           "q": {"type": "array", "items": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": -0.125},
           "maxItems": 3}}, "required": ["p", "q"]})",
        // Strings held to a pattern (anchored or not) and to a format.
        R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-c]+-\\d{2}$"},
           "day": {"format": "date"}, "has": {"type": "string", "pattern": "b[xy]"}}, "required": ["code", "day"]})",
        // ... and within length limits (a character past ASCII included).
        R"({"type": "object", "properties": {"w": {"type": "string", "pattern": "^[a-e\u00e9]+\\d*$", "minLength": 3,
           "maxLength": 6}, "u": {"type": "string", "pattern": "x", "maxLength": 4}}, "required": ["w", "u"]})",
        // Limits further than one token reaches (the mask keys see counts as distances to them).
        R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 12, "maxLength": 16},
           "a": {"type": "array", "items": {"enum": [1, 22]}, "minItems": 11, "maxItems": 13}}, "required": ["s", "a"]})",
    };
    std::vector<std::string> vocab = {"", "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "0", "1", "2", "3", "7", "-",
                                      ".", "e", "5", "true", "false", "null", "tr", "ue", "n", "x", "y", "k", "v", "s",
                                      "t", "a", "b", "name", "age", "tags", "ok", "email", "\\", "\\u", "d83d", "de00",
                                      "00e9", "\"}", "}]", "]}}", "]]", "\": ", "\":{\"", ", \"", "1}", "1.5,", "ab\"",
                                      "\xc3", "\xa9", "\xc3\xa9", "{\"", "[[", "  ", "{}", "[]", "12", "123", "\"x\"",
                                      "{\"k\":1}", "\"name\": \"", "\"tags\": [", "\"v\":", "\"k\":[", "@",
                                      "u", "l", "r", "f", "c", "d", "4", "6", "8", "9", "+", "E", "/",
                                      "abcdefghi", "1,22,1,22"};  // as long as the longest: the counts' keys reach that far
    for (char c = 'a'; c <= 'z'; ++c)  // every byte a text here needs has a token of its own
        if (std::find(vocab.begin(), vocab.end(), std::string(1, c)) == vocab.end()) vocab.push_back(std::string(1, c));
    JsonVocab v(vocab);
    std::mt19937 rng(11);
    int64_t checked = 0, completed = 0;
    std::vector<int> done(schemas.size(), 0);
    for (size_t si = 0; si < schemas.size(); ++si) {
        const auto sc = schema(schemas[si]);
        const json doc = json::parse(schemas[si]);
        for (int run = 0; run < 25; ++run) {
            JsonAcceptor s(sc);
            const std::string text = random_walk(v, vocab, s, rng, 120, 40, "schema " + std::to_string(si), checked);
            json value;
            if (!s.complete() || !parsed(text, value)) continue;
            ++completed;
            ++done[si];
            EXPECT_TRUE(valid(value, doc, doc)) << "schema " << si << ": " << text;
        }
    }
    for (size_t si = 0; si < schemas.size(); ++si) EXPECT_GT(done[si], 0) << "schema " << si << " never completed";
    EXPECT_GT(checked, 100000);
    EXPECT_GT(completed, 60);
}

// A mask is kept under the acceptor's key, which must see every frame a token can reach: a token
// that ends a number and closes three containers lands in the frame below them, where "," is
// refused at the top (the object is complete) and taken inside another object of the same node.
TEST(JsonSchema, MaskKeysSeeTheFrameATokenLandsIn) {
    const auto sc = schema(R"({"$defs": {"o": {"type": "object", "additionalProperties": {"anyOf": [{"$ref": "#/$defs/o"},
                              {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}]}}},
                              "$ref": "#/$defs/o"})");
    JsonVocab v({"]]},", "x"});
    JsonAcceptor top(sc), inner(sc);
    ASSERT_TRUE(top.push(std::string(R"({"a":[[1)")));
    ASSERT_TRUE(inner.push(std::string(R"({"b":{"a":[[1)")));
    EXPECT_EQ(v.allowed(top)[0], 0);
    EXPECT_EQ(v.allowed(inner)[0], 1);
    EXPECT_EQ(v.allowed(top)[0], 0);
}

// Counters that no limit needs stay put, so the states of a long string or array repeat and
// their masks are found again (a new state costs a pass over the vocabulary).
TEST(JsonSchema, StatesWithoutLimitsRepeat) {
    auto key_after = [](const std::string& schema_text, const std::string& text) {
        JsonAcceptor a(schema(schema_text));
        EXPECT_TRUE(a.push(text)) << text;
        return a.key(4, 6);
    };
    const char* free = R"({"type": "object", "properties": {"s": {"type": "string"}, "a": {"type": "array"}}})";
    EXPECT_EQ(key_after(free, R"({"s": "x)"), key_after(free, R"({"s": "xy\n\u00e9)"));
    EXPECT_EQ(key_after(free, R"({"a": [1, )"), key_after(free, R"({"a": [1, 2, "x", )"));
    const char* limited = R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}, "a": {"type": "array", "minItems": 2}}})";
    EXPECT_NE(key_after(limited, R"({"s": "x)"), key_after(limited, R"({"s": "xy)"));
    EXPECT_EQ(key_after(limited, R"({"a": [1, 2, )"), key_after(limited, R"({"a": [1, 2, 3, )"));  // counted to 2
    EXPECT_NE(key_after(limited, R"({"a": [1, )"), key_after(limited, R"({"a": [1, 2, )"));
    // A bounded string: its count seen as the distance to the limits, as far as a token reaches
    // (6 bytes here).
    const char* bounded = R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 10, "maxLength": 30}}})";
    const std::string twenty(20, 'x');
    EXPECT_EQ(key_after(bounded, R"({"s": "x)"), key_after(bounded, R"({"s": "xxx)"));  // 9 and 7 to the minimum: past reach
    EXPECT_NE(key_after(bounded, R"({"s": "xxx)"), key_after(bounded, R"({"s": "xxxx)"));  // 7 and 6: a token can reach it
    EXPECT_NE(key_after(bounded, R"({"s": "xxxx)"), key_after(bounded, R"({"s": "xxxxx)"));
    EXPECT_EQ(key_after(bounded, R"({"s": "xxxxxxxxxxx)"), key_after(bounded, R"({"s": "xxxxxxxxxxxxxxxxxxxxxxx)"));  // 11 and 23 chars
    EXPECT_NE(key_after(bounded, R"({"s": "xxxxxxxxxxx)"), key_after(bounded, R"({"s": ")" + twenty + "xxxx"));  // 24: 6 left
}

namespace {
// A random schema of the supported keywords, `depth` levels at most.
json random_schema(std::mt19937& rng, int depth) {
    auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
    const int kind = depth <= 0 ? 2 + pick(7) : pick(9);
    switch (kind) {
        case 0: {  // object with properties
            json s = {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}};
            const char* names[] = {"a", "b", "cd", "e f", "\u00e9"};
            json req = json::array();
            for (int i = 0, n = pick(4); i < n; ++i) {
                s["properties"][names[pick(5)]] = random_schema(rng, depth - 1);
            }
            for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it)
                if (pick(2)) req.push_back(it.key());
            s["required"] = req;
            return s;
        }
        case 1: {  // array
            json s = {{"type", "array"}, {"items", random_schema(rng, depth - 1)}};
            const int lo = pick(3);
            if (pick(2)) s["minItems"] = lo;
            if (pick(2)) s["maxItems"] = lo + pick(3);
            return s;
        }
        case 2: {  // string
            json s = {{"type", "string"}};
            const int lo = pick(4);
            if (pick(2)) s["minLength"] = lo;
            if (pick(2)) s["maxLength"] = lo + pick(5);
            return s;
        }
        case 3: return {{"type", pick(2) ? "integer" : "number"}};
        case 4: return {{"type", pick(2) ? "boolean" : "null"}};
        case 5: {
            const json values[] = {1, 12, 123, -1.5, "x", "xy", nullptr, true, {{"k", 1}}, json::array({1})};
            json e = json::array();
            for (int i = 0, n = 1 + pick(4); i < n; ++i) e.push_back(values[pick(10)]);
            return {{"enum", e}};
        }
        case 6: return {{"type", json::array({"string", "integer", "null"})}, {"maxLength", 2}};
        case 7: return {{"type", "object"}, {"additionalProperties", random_schema(rng, depth - 1)}};
        default: return {{"anyOf", json::array({random_schema(rng, depth - 1), random_schema(rng, depth - 1)})}};
    }
}
}  // namespace

// Random schemas, random walks byte by byte (every printable ASCII byte, UTF-8 pieces and a few
// longer tokens): each mask is each token's check, no accepted text is a dead end, and every
// complete text is valid.
TEST(JsonSchema, RandomSchemasHaveNoDeadEnds) {
    std::vector<std::string> vocab = {"", "\n", "\\u00e9", "\\ud83d\\ude00", "\\u", "\xc3\xa9", "\xc3", "\xa9",
                                      "\xf0\x9f\x98\x80", "true", "null", "\"a\":", "\"cd\": ", "12", "}]", "]}", "\",\""};
    for (int c = 0x20; c < 0x7f; ++c) vocab.push_back(std::string(1, char(c)));
    JsonVocab v(vocab);
    std::mt19937 rng(23);
    int64_t complete = 0, walks = 0;
    for (int si = 0; si < 400; ++si) {
        const json doc = {{"type", "object"}, {"properties", {{"r", random_schema(rng, 3)}}}, {"required", {"r"}}};
        std::shared_ptr<const JsonSchema> sc;
        try {
            sc = std::make_shared<const JsonSchema>(compile_json_schema(doc.dump(), "test"));
        } catch (const Error& e) {
            ADD_FAILURE() << e.what() << "\n" << doc.dump();
            continue;
        }
        ++walks;
        JsonAcceptor s(sc);
        int64_t checked = 0;
        const std::string text = random_walk(v, vocab, s, rng, 300, 30, doc.dump(), checked);
        json value;
        if (!s.complete() || !parsed(text, value)) continue;
        ++complete;
        EXPECT_TRUE(valid(value, doc, doc)) << doc.dump() << "\n" << text;
    }
    EXPECT_EQ(walks, 400);
    EXPECT_GT(complete, 300);
}

// Nesting is measured on the text (strings' brackets not counted), and a schema nesting past
// kMaxJsonDepth is refused before it is parsed: its compiler and serialiser recurse per level.
TEST(JsonSchema, NestingDepthIsBounded) {
    EXPECT_EQ(json_text_depth(""), 0);
    EXPECT_EQ(json_text_depth("{\"a\": [1, {\"b\": \"[[[{\\\"\"}]}"), 3);
    EXPECT_EQ(json_text_depth("]]]["), 1);
    const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
    EXPECT_EQ(json_text_depth(deep), kMaxJsonDepth + 1);
    EXPECT_THROW(compile_json_schema(deep, "test"), Error);
}
