#include "runtime/json_schema.h"

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {
namespace {
// ordered_json keeps an object's keys in the text's order: properties are generated in it.
using json = nlohmann::ordered_json;
using Kind = JsonSchema::Kind;
using Node = JsonSchema::Node;

// Keywords that only describe: they change nothing a value may be.
const std::set<std::string> kAnnotations = {"$schema", "$id",      "$comment", "title",    "description", "default",
                                            "examples", "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
                                            "discriminator"};  // (OpenAPI's, beside a oneOf: which property tells them apart)
// What this compiler holds generation to.
const std::set<std::string> kSupported = {"type",     "properties", "required",  "additionalProperties", "items",
                                          "minItems", "maxItems",   "minLength", "maxLength",            "enum",
                                          "const",    "anyOf",      "allOf",     "$ref",                 "uniqueItems",
                                          "pattern",  "format",     "oneOf",     "minimum",              "maximum",      "prefixItems",
                                          "multipleOf",
                                          "exclusiveMinimum",       "exclusiveMaximum"};
const std::vector<std::string> kBounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
constexpr size_t kMaxNodes = 20000;
constexpr int kMaxDepth = 128;        // schema objects inside one another, $refs followed included
constexpr int32_t kMaxChoiceDepth = 64;  // anyOf inside anyOf (through $refs too)
constexpr int kMaxOneOfDepth = 16;       // how deep a oneOf's alternatives are compared
constexpr int64_t kMaxEndsTable = 4 << 20;  // a pattern's states x lengths under length limits (bounds its
                                            // compile time to tens of milliseconds)
// Counts past this can never be reached within a context: a maximum is no limit, a minimum is refused.
constexpr int64_t kMaxCount = int64_t(1) << 30;

Node of(Kind k) {
    Node n;
    n.kind = k;
    return n;
}

bool has_type(const json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "boolean") return v.is_boolean();
    return v.is_null();
}

class Compiler {
public:
    Compiler(const json& doc, std::string what) : doc_(doc), what_(std::move(what)) {}

    JsonSchema run() {
        out_.key = add(of(Kind::String));
        out_.root = node(doc_, "#", 0);
        check_cycles();
        settle(out_);
        check_one_of();
        prune();
        skip_wrappers();
        settle(out_);
        check_choice_depth();
        if (!delimited(out_.root, {}))
            bad("#", "the top value must end by itself (an object, array, string, boolean or null, or an enum of "
                     "those), not a number");
        return std::move(out_);
    }

private:
    [[noreturn]] void bad(const std::string& path, const std::string& msg) const {
        fail(what_, ": json_schema at ", path, ": ", msg);
    }

    int32_t add(Node n) {
        if (out_.nodes.size() >= kMaxNodes) bad("#", cat("more than ", kMaxNodes, " schema nodes"));
        out_.nodes.push_back(std::move(n));
        return int32_t(out_.nodes.size() - 1);
    }

    // Any JSON value: an object of free keys, an array, a string, a number, true/false/null.
    int32_t any() {
        if (any_ >= 0) return any_;
        any_ = add(of(Kind::AnyOf));
        Node obj = of(Kind::Object), arr = of(Kind::Array), lit = of(Kind::Const);
        obj.extra = any_;
        arr.items = any_;
        lit.texts = {"false", "null", "true"};
        const std::vector<int32_t> alts = {add(obj), add(arr), add(of(Kind::String)), add(of(Kind::Number)), add(lit)};
        out_.nodes[size_t(any_)].alts = alts;
        return any_;
    }

    int64_t count(const json& s, const char* k, const std::string& path, int64_t def) const {
        if (!s.contains(k)) return def;
        const json& v = s[k];
        if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
            bad(path + "/" + k, "must be a non-negative integer");
        if (v.get<uint64_t>() <= uint64_t(kMaxCount)) return v.get<int64_t>();
        if (def < 0) return -1;  // a maximum no generation reaches
        bad(path + "/" + k, cat("more than ", kMaxCount, " can never be generated"));
    }

    // The keys of `s` other than annotations must all be in `allowed`.
    void only(const json& s, const std::set<std::string>& allowed, const std::string& path, const char* with) const {
        for (auto it = s.begin(); it != s.end(); ++it)
            if (!kAnnotations.count(it.key()) && !allowed.count(it.key()))
                bad(path, cat("\"", it.key(), "\" beside \"", with, "\" is not supported"));
    }

    int32_t node(const json& s, const std::string& path, int depth) {
        if (depth > kMaxDepth) bad(path, cat("nested deeper than ", kMaxDepth));
        if (s.is_boolean()) {
            if (!s.get<bool>()) bad(path, "the schema false allows no value");
            return any();
        }
        if (!s.is_object()) bad(path, "a schema is an object or a boolean");
        for (auto it = s.begin(); it != s.end(); ++it) {
            const std::string& k = it.key();
            if (kAnnotations.count(k) || kSupported.count(k)) continue;
            bad(path, cat("keyword \"", k, "\" is not supported (shardlm holds generation to: type, properties, "
                                           "required, additionalProperties, items, prefixItems, minItems, maxItems, "
                                           "minLength, maxLength, pattern, format, minimum, maximum, multipleOf, enum, "
                                           "const, anyOf, oneOf, a single allOf, $ref)"));
        }
        if (s.contains("uniqueItems") && s["uniqueItems"] != json(false)) bad(path + "/uniqueItems", "only false is supported");
        if (s.contains("$ref")) {
            only(s, {"$ref"}, path, "$ref");
            return ref(s["$ref"], path + "/$ref", depth);
        }
        if (s.contains("allOf")) {
            only(s, {"allOf"}, path, "allOf");
            const json& a = s["allOf"];
            if (!a.is_array() || a.size() != 1) bad(path + "/allOf", "only an allOf of one schema is supported");
            return node(a[0], path + "/allOf/0", depth + 1);
        }
        for (const std::string key : {"anyOf", "oneOf"}) {
            if (!s.contains(key)) continue;
            only(s, {key}, path, key.c_str());
            const json& a = s[key];
            if (!a.is_array() || a.empty()) bad(path + "/" + key, "must be a non-empty array of schemas");
            const int32_t id = add(of(Kind::AnyOf));
            std::vector<int32_t> alts;
            for (size_t i = 0; i < a.size(); ++i) alts.push_back(node(a[i], cat(path, "/", key, "/", i), depth + 1));
            out_.nodes[size_t(id)].alts = alts;
            if (key == "oneOf") one_of_.emplace_back(id, path);
            return id;
        }
        std::vector<std::string> types;
        if (s.contains("type")) {
            const json& t = s["type"];
            for (const json& e : t.is_array() ? t : json::array({t})) {
                if (!e.is_string() || !kTypes.count(e.get<std::string>()))
                    bad(path + "/type", "must be one of object, array, string, number, integer, boolean, null, or an array of them");
                if (std::find(types.begin(), types.end(), e.get<std::string>()) == types.end()) types.push_back(e.get<std::string>());
            }
            if (types.empty()) bad(path + "/type", "an empty list of types allows no value");
        }
        if (s.contains("enum") || s.contains("const")) {
            only(s, {"enum", "const", "type"}, path, s.contains("enum") ? "enum" : "const");
            if (s.contains("enum") && s.contains("const")) bad(path, "both enum and const");
            json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
            if (!values.is_array()) bad(path + "/enum", "must be an array");
            Node n = of(Kind::Const);
            for (const json& v : values)
                if (types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(v, t); }))
                    n.texts.push_back(v.dump());
            if (n.texts.empty()) bad(path, "no enum or const value has the schema's type");
            std::sort(n.texts.begin(), n.texts.end());
            n.texts.erase(std::unique(n.texts.begin(), n.texts.end()), n.texts.end());
            return add(std::move(n));
        }
        if (types.empty()) {  // without a type, the keywords present say which kind of value
            if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) types = {"object"};
            else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems"))
                types = {"array"};
            else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format"))
                types = {"string"};
            else if (s.contains("multipleOf") ||
                     std::any_of(kBounds.begin(), kBounds.end(), [&](const std::string& k) { return s.contains(k); }))
                types = {"integer"};  // (the integers in the bounds: valid whatever else the schema allows)
            else return any();
        }
        if (types.size() == 1) return typed(s, types[0], path, depth);
        const int32_t id = add(of(Kind::AnyOf));
        std::vector<int32_t> alts;
        for (const std::string& t : types) alts.push_back(typed(s, t, path, depth));
        out_.nodes[size_t(id)].alts = alts;
        return id;
    }

    // minimum, maximum and their exclusive forms as given (numbers of at most 10^18 in size).
    struct Bound {
        const json* v;
        std::string path;
        double x;
        bool upper, exclusive;
    };
    std::vector<Bound> bounds_of(const json& s, const std::string& path) const {
        std::vector<Bound> out;
        for (const std::string& k : kBounds) {
            if (!s.contains(k)) continue;
            const json& v = s[k];
            if (!v.is_number()) bad(path + "/" + k, "must be a number");
            const double x = v.get<double>();
            if (!(std::fabs(x) <= 1e18)) bad(path + "/" + k, "bounds beyond 10^18 in size are not supported");
            out.push_back({&v, path + "/" + k, x, k == "maximum" || k == "exclusiveMaximum", k.rfind("exclusive", 0) == 0});
        }
        return out;
    }

    // An integer's bounds (a fraction rounds inwards).
    std::pair<std::optional<int64_t>, std::optional<int64_t>> integer_bounds(const json& s, const std::string& path) const {
        std::optional<int64_t> lo, hi;
        for (const Bound& k : bounds_of(s, path)) {
            int64_t b = 0;
            if (k.v->is_number_integer()) b = k.v->get<int64_t>() + (k.exclusive ? (k.upper ? -1 : 1) : 0);
            else if (k.upper) b = int64_t(k.exclusive ? std::ceil(k.x) - 1 : std::floor(k.x));
            else b = int64_t(k.exclusive ? std::floor(k.x) + 1 : std::ceil(k.x));
            if (k.upper) hi = hi ? std::min(*hi, b) : b;
            else lo = lo ? std::max(*lo, b) : b;
        }
        if (lo && hi && *lo > *hi) bad(path, cat("no integer lies in [", *lo, ", ", *hi, "]"));
        return {lo, hi};
    }

    // A number's bounds as decimal texts (a double's shortest text that reads back as it, at most
    // 20 fraction digits); of two on one side the tighter, at equal values the exclusive one.
    std::pair<std::optional<DecimalBound>, std::optional<DecimalBound>> number_bounds(const json& s, const std::string& path) const {
        std::optional<DecimalBound> lo, hi;
        std::optional<double> lo_v, hi_v;
        for (const Bound& k : bounds_of(s, path)) {
            std::optional<DecimalBound>& cur = k.upper ? hi : lo;
            std::optional<double>& cur_v = k.upper ? hi_v : lo_v;
            if (cur && !(k.upper ? k.x < *cur_v : k.x > *cur_v) && !(k.x == *cur_v && k.exclusive)) continue;
            cur = DecimalBound{k.v->is_number_float() ? decimal_text(k.x, k.path) : k.v->dump(), k.exclusive};
            cur_v = k.x;
        }
        return {lo, hi};
    }

    // multipleOf m (> 0): m as p / 10^q, the DFA of the multiples' texts (an integer's with no fraction).
    PatternDfa multiple_of(const json& v, bool integer, const std::string& path) const {
        if (!v.is_number() || !(v.get<double>() > 0)) bad(path, "must be a number above 0");
        const double x = v.get<double>();
        if (x > 1e15) bad(path, "a multipleOf past 10^15 is not supported");
        std::string text = v.is_number_float() ? decimal_text(x, path) : v.dump();
        const size_t dot = text.find('.');
        int q = 0;
        if (dot != std::string::npos) {
            q = int(text.size() - dot - 1);
            text.erase(dot, 1);
        }
        if (q > 9) bad(path, "a multipleOf with more than 9 fraction digits is not supported");
        const uint64_t p = std::stoull(text);
        if (p * uint64_t(q + 2) + 4 > kMaxPatternStates)
            bad(path, cat("multipleOf ", v.dump(), " needs more than ", kMaxPatternStates,
                          " automaton states (at most about ", kMaxPatternStates / uint64_t(q + 2), " units of its last digit)"));
        return multiple_of_dfa(p, q, !integer, cat(what_, ": json_schema at ", path));
    }

    // The shortest decimal text of x that reads back as x, without an exponent.
    std::string decimal_text(double x, const std::string& path) const {
        char buf[64];
        for (int digits = 1; digits <= 17; ++digits) {
            std::snprintf(buf, sizeof buf, "%.*e", digits - 1, x);
            if (std::strtod(buf, nullptr) == x) break;
        }
        // buf: [-]d.ddde[+-]XX: the digits, shifted by the exponent.
        std::string t = buf;
        const size_t e = t.find('e');
        const int exp = std::atoi(t.c_str() + e + 1);
        const bool neg = t[0] == '-';
        std::string digits;
        for (size_t i = neg ? 1 : 0; i < e; ++i)
            if (t[i] != '.') digits += t[i];
        const int point = exp + 1;  // digits before the decimal point
        if (int(digits.size()) - point > 20) bad(path, "bounds with more than 20 fraction digits are not supported");
        std::string out;
        if (point <= 0) out = "0." + std::string(size_t(-point), '0') + digits;
        else if (point >= int(digits.size())) out = digits + std::string(size_t(point) - digits.size(), '0');
        else out = digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
        return (neg ? "-" : "") + out;
    }

    // A value of one type, from the keywords of `s` that apply to it.
    int32_t typed(const json& s, const std::string& t, const std::string& path, int depth) {
        const bool bounded = std::any_of(kBounds.begin(), kBounds.end(), [&](const std::string& k) { return s.contains(k); });
        if (t == "number" || t == "integer") {
            // Bounds and multipleOf: the texts (without exponents) of the range, of the multiples,
            // or of both.
            const bool integer = t == "integer";
            Node n = of(integer ? Kind::Integer : Kind::Number);
            std::optional<PatternDfa> dfa;
            const std::string where = cat(what_, ": json_schema at ", path);
            if (bounded && integer) {
                const auto [lo, hi] = integer_bounds(s, path);
                dfa = compile_pattern(integer_range_pattern(lo, hi), where);
            } else if (bounded) {
                const auto [lo, hi] = number_bounds(s, path);
                const std::string p = number_range_pattern(lo, hi);
                if (p.empty()) bad(path, cat("no number lies between the bounds ", lo ? lo->text : "", " and ", hi ? hi->text : ""));
                dfa = compile_pattern(p, where);
            }
            if (s.contains("multipleOf")) {
                const PatternDfa m = multiple_of(s["multipleOf"], integer, path + "/multipleOf");
                dfa = dfa ? intersect(*dfa, m, where) : m;
            }
            if (dfa) {
                out_.patterns.push_back(std::move(*dfa));
                n.pattern = int32_t(out_.patterns.size() - 1);
            }
            return add(std::move(n));
        }
        if (t == "boolean" || t == "null") {
            Node n = of(Kind::Const);
            n.texts = t == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"false", "true"};
            return add(std::move(n));
        }
        // A string's characters or an array's items: [min_count, max_count] from keywords lo, hi.
        auto counted = [&](Kind kind, const char* lo, const char* hi) {
            Node n = of(kind);
            n.min_count = count(s, lo, path, 0);
            n.max_count = count(s, hi, path, -1);
            if (n.max_count >= 0 && n.max_count < n.min_count) bad(path, cat(hi, " is below ", lo));
            return n;
        };
        if (t == "string") {
            Node n = counted(Kind::String, "minLength", "maxLength");
            // pattern or format (which apply to strings only): the characters match its DFA.
            // (formats that say nothing of the characters, as Pydantic writes SecretStr, bytes and Path: annotations)
            const bool pat = s.contains("pattern"),
                       fmt = s.contains("format") && s["format"] != json("password") && s["format"] != json("binary") &&
                             s["format"] != json("path");
            if (!pat && !fmt) return add(std::move(n));
            const char* key = pat ? "pattern" : "format";  // (both: a string matches the two)
            std::optional<PatternDfa> dfa;
            for (const char* k : {"pattern", "format"}) {
                if (!s.contains(k) || (k == std::string("format") && !fmt)) continue;
                if (!s[k].is_string()) bad(path + "/" + k, "must be a string");
                const std::string text = s[k];
                const std::string re = k == std::string("pattern") ? text : format_pattern(text);
                if (re.empty())
                    bad(path + "/format", cat("format \"", text, "\" is not supported (date, time, date-time, duration, uuid, "
                                              "uuid1/3/4/5, ipv4, ipv6, ipvanyaddress, email, hostname, uri; password, "
                                              "binary and path as plain strings)"));
                const PatternDfa d = compile_pattern(re, cat(what_, ": json_schema at ", path, "/", k));
                dfa = dfa ? intersect(*dfa, d, cat(what_, ": json_schema at ", path, ": pattern and format")) : d;
            }
            out_.patterns.push_back(std::move(*dfa));
            n.pattern = int32_t(out_.patterns.size() - 1);
            if (n.min_count > 0 || n.max_count >= 0) {
                const PatternDfa& d = out_.patterns.back();
                const int64_t states = int64_t(d.edges.size());
                const int64_t span = n.max_count >= 0 ? std::min(n.max_count, n.min_count + states) : n.min_count + states;
                if ((span + 1) * states > kMaxEndsTable)
                    bad(path, cat("\"", key, "\" with these length limits needs too large a table (", states,
                                  " states x ", span + 1, " lengths)"));
                n.span = int32_t(std::max<int64_t>(span, 1));
                n.ends = pattern_ends(d, n.span);
                if (n.ends[size_t(d.start) * size_t(n.span + 1) + size_t(n.min_count)] > span)
                    bad(path, cat("no string of the ", key, " has ", n.min_count,
                                  n.max_count >= 0 ? cat(" to ", n.max_count) : std::string(" or more"), " characters"));
            }
            return add(std::move(n));
        }
        if (t == "array") {
            Node n = counted(Kind::Array, "minItems", "maxItems");
            if (s.contains("items") && s["items"].is_array())
                bad(path + "/items", "an array of schemas (draft 7's tuple items) is not supported: write prefixItems");
            const json none = json::array();
            const json& prefix = s.contains("prefixItems") ? s["prefixItems"] : none;
            if (!prefix.is_array()) bad(path + "/prefixItems", "must be an array of schemas");
            // items: false after prefixItems: no items past the tuple's.
            const bool closed = prefix.size() > 0 && s.contains("items") && s["items"] == json(false);
            if (closed) {
                const int64_t p = int64_t(prefix.size());
                n.max_count = n.max_count < 0 ? p : std::min(n.max_count, p);
                if (n.min_count > n.max_count) bad(path, cat("minItems ", n.min_count, " is past the ", p, " prefixItems"));
            }
            const int32_t id = add(std::move(n));
            std::vector<int32_t> firsts;
            for (size_t i = 0; i < prefix.size(); ++i)
                firsts.push_back(node(prefix[i], cat(path, "/prefixItems/", i), depth + 1));
            const int32_t items = s.contains("items") && !closed ? node(s["items"], path + "/items", depth + 1) : any();
            out_.nodes[size_t(id)].values = std::move(firsts);
            out_.nodes[size_t(id)].items = items;
            return id;
        }
        // object
        const int32_t id = add(of(Kind::Object));
        Node n = of(Kind::Object);
        std::map<std::string, bool> required;
        if (s.contains("required")) {
            const json& r = s["required"];
            if (!r.is_array()) bad(path + "/required", "must be an array of property names");
            for (const json& e : r) {
                if (!e.is_string()) bad(path + "/required", "must be an array of property names");
                required[e.get<std::string>()] = false;
            }
        }
        const json extra = s.value("additionalProperties", json(true));
        if (s.contains("properties")) {
            const json& p = s["properties"];
            if (!p.is_object()) bad(path + "/properties", "must be an object of schemas");
            for (auto pit = p.begin(); pit != p.end(); ++pit) {
                const std::string& name = pit.key();
                n.keys.push_back(json(name).dump());
                n.values.push_back(node(pit.value(), path + "/properties/" + pointer_escape(name), depth + 1));
                const auto it = required.find(name);
                n.required.push_back(it != required.end());
                if (it != required.end()) it->second = true;
            }
        }
        for (const auto& [name, found] : required) {
            if (found) continue;
            if (extra == json(false))
                bad(path + "/required", cat("\"", name, "\" is required but not a property, and additionalProperties is false"));
            n.keys.push_back(json(name).dump());
            n.values.push_back(extra.is_boolean() ? any() : node(extra, path + "/additionalProperties", depth + 1));
            n.required.push_back(1);
        }
        if (n.keys.empty() && extra != json(false))
            n.extra = extra.is_boolean() ? any() : node(extra, path + "/additionalProperties", depth + 1);
        else if (!extra.is_boolean() && !extra.is_object())
            bad(path + "/additionalProperties", "must be a boolean or a schema");
        out_.nodes[size_t(id)] = std::move(n);
        return id;
    }

    int32_t ref(const json& r, const std::string& path, int depth) {
        if (!r.is_string()) bad(path, "must be a string");
        const std::string s = r.get<std::string>();
        if (s.empty() || s[0] != '#') bad(path, cat("\"", s, "\": only references within the schema (\"#...\") are supported"));
        const auto it = refs_.find(s);
        if (it != refs_.end()) return it->second;
        const json* target = nullptr;
        try {
            target = &doc_.at(json::json_pointer(s.substr(1)));
        } catch (const json::exception&) {
            bad(path, cat("\"", s, "\" points at nothing in the schema"));
        }
        // The node is known by its reference before it is built, so a schema can refer to itself.
        const int32_t id = add(of(Kind::AnyOf));
        refs_[s] = id;
        const int32_t target_id = node(*target, s, depth + 1);
        out_.nodes[size_t(id)].alts = {target_id};
        return id;
    }

    // A chain of anyOf and $ref that comes back to itself before any byte would loop for ever.
    // (A depth-first walk with its own stack: the chains of a large schema can be long.)
    // oneOf is generated as anyOf where no value can match two of its alternatives (a value of
    // one then matches exactly one): checked once every node is built, as a $ref's may come late.
    void check_one_of() const {
        for (const auto& [id, path] : one_of_) {
            const std::vector<int32_t>& alts = out_.nodes[size_t(id)].alts;
            for (size_t i = 0; i < alts.size(); ++i)
                for (size_t j = i + 1; j < alts.size(); ++j)
                    if (!disjoint(alts[i], alts[j], 0))
                        bad(path + "/oneOf", cat("alternatives ", i, " and ", j, " may both match a value (shardlm takes a "
                                                 "oneOf whose alternatives exclude each other: values of different types, "
                                                 "different constants, or objects with a required property of different "
                                                 "constant values)"));
        }
    }
    // Whether no value matches both nodes, as far as can be shown: different first bytes
    // (different JSON types), constants with no value in common, or objects whose value of a
    // property both require cannot match both (a discriminator's constants).
    bool disjoint(int32_t x, int32_t y, int depth) const {
        if (depth > kMaxOneOfDepth) return false;
        if ((out_.nodes[size_t(x)].first & out_.nodes[size_t(y)].first).none()) return true;
        const Node &a = out_.nodes[size_t(x)], &b = out_.nodes[size_t(y)];
        if (a.kind == Kind::AnyOf)
            return std::all_of(a.alts.begin(), a.alts.end(), [&](int32_t k) { return disjoint(k, y, depth + 1); });
        if (b.kind == Kind::AnyOf)
            return std::all_of(b.alts.begin(), b.alts.end(), [&](int32_t k) { return disjoint(x, k, depth + 1); });
        if (a.kind == Kind::Const && b.kind == Kind::Const) {
            // Equal texts are one value; numbers are left alone (1 and 1.0 are one value too).
            auto number = [](const std::string& t) { return t[0] == '-' || (t[0] >= '0' && t[0] <= '9'); };
            for (const std::string& p : a.texts)
                for (const std::string& q : b.texts)
                    if (p == q || (number(p) && number(q))) return false;
            return true;
        }
        if (a.kind == Kind::Object && b.kind == Kind::Object)
            for (size_t i = 0; i < a.keys.size(); ++i)
                for (size_t j = 0; j < b.keys.size(); ++j)
                    if (a.required[i] && b.required[j] && a.keys[i] == b.keys[j] &&
                        disjoint(a.values[i], b.values[j], depth + 1))
                        return true;
        return false;
    }

    void check_cycles() const {
        const std::vector<Node>& nodes = out_.nodes;
        std::vector<uint8_t> mark(nodes.size(), 0);  // 1: on the path, 2: done
        std::vector<std::pair<int32_t, size_t>> path;  // a node and its next alternative
        for (size_t i = 0; i < nodes.size(); ++i) {
            if (mark[i]) continue;
            mark[i] = 1;
            path.emplace_back(int32_t(i), 0);
            while (!path.empty()) {
                const int32_t id = path.back().first;
                const size_t k = path.back().second++;
                const std::vector<int32_t>& alts = nodes[size_t(id)].alts;
                if (k == alts.size()) {
                    mark[size_t(id)] = 2;
                    path.pop_back();
                    continue;
                }
                const int32_t a = alts[k];
                if (mark[size_t(a)] == 1) bad("#", "a $ref or anyOf refers back to itself before any value starts");
                if (mark[size_t(a)] == 0) {
                    mark[size_t(a)] = 1;
                    path.emplace_back(a, 0);
                }
            }
        }
    }

    // Nodes that have a finite value, found as a fixed point; the others are taken out of the
    // choices that lead to them (anyOf alternatives, optional properties, items of an array that
    // may be empty), so generation never enters a value it cannot finish. A schema whose top value
    // has none (a required property that refers back to its own object) is refused.
    void prune() {
        std::vector<Node>& nodes = out_.nodes;
        std::vector<uint8_t> ok(nodes.size(), 0);
        auto finite = [&](const Node& n) {
            switch (n.kind) {
                case Kind::Array:  // the items up to min_count: the tuple's, then `items`
                    for (size_t i = 0; i < n.values.size() && int64_t(i) < n.min_count; ++i)
                        if (!ok[size_t(n.values[i])]) return false;
                    return n.min_count <= int64_t(n.values.size()) || ok[size_t(n.items)] != 0;
                case Kind::Object:
                    for (size_t i = 0; i < n.keys.size(); ++i)
                        if (n.required[i] && !ok[size_t(n.values[i])]) return false;
                    return true;  // free keys: {} at least
                case Kind::AnyOf:
                    return std::any_of(n.alts.begin(), n.alts.end(), [&](int32_t a) { return ok[size_t(a)] != 0; });
                default: return true;
            }
        };
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t i = 0; i < nodes.size(); ++i)
                if (!ok[i] && finite(nodes[i])) ok[i] = changed = true;
        }
        if (!ok[size_t(out_.root)])
            bad("#", "no finite value fits the schema (a required property or item refers back to its own value without end)");
        for (Node& n : nodes) {
            n.alts.erase(std::remove_if(n.alts.begin(), n.alts.end(), [&](int32_t a) { return !ok[size_t(a)]; }), n.alts.end());
            if (n.kind == Kind::Array) {  // no more items than up to the first that cannot end
                int64_t most = int64_t(n.values.size());
                for (size_t i = 0; i < n.values.size(); ++i)
                    if (!ok[size_t(n.values[i])]) {
                        most = int64_t(i);
                        break;
                    }
                if (most < int64_t(n.values.size()) || !ok[size_t(n.items)])
                    n.max_count = n.max_count < 0 ? most : std::min(n.max_count, most);
                continue;
            }
            for (size_t i = n.keys.size(); i-- > 0;)
                if (!ok[size_t(n.values[i])]) {
                    n.keys.erase(n.keys.begin() + ptrdiff_t(i));
                    n.values.erase(n.values.begin() + ptrdiff_t(i));
                    n.required.erase(n.required.begin() + ptrdiff_t(i));
                }
            if (n.extra >= 0 && !ok[size_t(n.extra)]) n.extra = -1;
        }
    }

    // A $ref is an anyOf of one alternative (and so is an anyOf pruned to one): every reference
    // to one goes to what it stands for, so the acceptor does not walk through them.
    void skip_wrappers() {
        std::vector<Node>& nodes = out_.nodes;
        auto target = [&](int32_t id) {
            while (id >= 0 && nodes[size_t(id)].kind == Kind::AnyOf && nodes[size_t(id)].alts.size() == 1)
                id = nodes[size_t(id)].alts[0];  // ends: check_cycles refused loops of anyOf
            return id;
        };
        for (Node& n : nodes) {
            for (int32_t& a : n.alts) a = target(a);
            for (int32_t& v : n.values) v = target(v);
            n.items = target(n.items);
            n.extra = target(n.extra);
        }
        out_.root = target(out_.root);
    }

    // The acceptor tries the alternatives of nested anyOf recursively at a value's first byte:
    // bounded, so a schema cannot make that deep.
    void check_choice_depth() const {
        std::vector<int32_t> height(out_.nodes.size(), -1);  // the deepest anyOf nesting below a node
        std::function<int32_t(int32_t, int32_t)> of_node = [&](int32_t id, int32_t level) {
            if (level > kMaxChoiceDepth) bad("#", cat("anyOf nested more than ", kMaxChoiceDepth, " deep"));
            if (height[size_t(id)] >= 0) return height[size_t(id)];
            int32_t h = 0;
            for (const int32_t a : out_.nodes[size_t(id)].alts) h = std::max(h, of_node(a, level + 1) + 1);
            if (level + h > kMaxChoiceDepth) bad("#", cat("anyOf nested more than ", kMaxChoiceDepth, " deep"));
            return height[size_t(id)] = h;
        };
        for (size_t i = 0; i < out_.nodes.size(); ++i) of_node(int32_t(i), 0);
    }

    // Whether every value of node `id` shows its own end (what the top value must: the text ends
    // there). A number does not: more digits could follow.
    bool delimited(int32_t id, std::set<int32_t> seen) const {
        const Node& n = out_.nodes[size_t(id)];
        if (n.kind == Kind::Number || n.kind == Kind::Integer) return false;
        if (n.kind == Kind::Const)
            return std::all_of(n.texts.begin(), n.texts.end(), [](const std::string& t) {
                return t[0] == '{' || t[0] == '[' || t[0] == '"' || t == "true" || t == "false" || t == "null";
            });
        if (n.kind != Kind::AnyOf || !seen.insert(id).second) return true;
        return std::all_of(n.alts.begin(), n.alts.end(), [&](int32_t a) { return delimited(a, seen); });
    }

    static std::string pointer_escape(const std::string& name) {
        std::string e;
        for (const char c : name) e += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
        return e;
    }

    const json& doc_;
    std::string what_;
    JsonSchema out_;
    std::map<std::string, int32_t> refs_;
    int32_t any_ = -1;
    std::vector<std::pair<int32_t, std::string>> one_of_;  // oneOf nodes and their places, to check
};
}  // namespace

namespace {
// The bytes that begin the UTF-8 of some code point in [lo, hi].
std::bitset<256> utf8_leads(uint32_t lo, uint32_t hi) {
    std::bitset<256> b;
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) b.set(c);
    // Each lead byte's characters: [first, last] (C2-DF: 2 bytes, E0-EF: 3, F0-F4: 4).
    for (uint32_t lead = 0xC2; lead <= 0xF4; ++lead) {
        const int more = lead < 0xE0 ? 1 : lead < 0xF0 ? 2 : 3;
        const uint32_t bits = lead & (0x3Fu >> more);
        uint32_t first = bits << (6 * more), last = first + (1u << (6 * more)) - 1;
        if (more == 2 && first < 0x800) first = 0x800;
        if (more == 3 && first < 0x10000) first = 0x10000;
        if (first <= hi && last >= lo) b.set(lead);
    }
    return b;
}

// A node's first bytes and emptiness from its parts' as they stand (one step of settle()).
void settle_one(const JsonSchema& s, Node& n) {
    switch (n.kind) {
        case Kind::Object: n.first.set('{'); break;
        case Kind::Array: n.first.set('['); break;
        case Kind::String: n.first.set('"'); break;
        case Kind::Number:
        case Kind::Integer:
        case Kind::Text:
            if (n.pattern >= 0) {
                const PatternDfa& d = s.patterns[size_t(n.pattern)];
                for (const PatternDfa::Edge& e : d.edges[size_t(d.start)]) n.first |= utf8_leads(e.lo, e.hi);
                n.nullable = n.kind == Kind::Text && d.accept[size_t(d.start)];
                break;
            }
            n.first.set('-');
            for (char c = '0'; c <= '9'; ++c) n.first.set(uint8_t(c));
            break;
        case Kind::Const:
            for (const std::string& t : n.texts) n.first.set(uint8_t(t[0]));
            break;
        case Kind::AnyOf:
            for (const int32_t a : n.alts) {
                n.first |= s.nodes[size_t(a)].first;
                n.nullable = n.nullable || s.nodes[size_t(a)].nullable;
            }
            break;
        case Kind::Seq:
            n.nullable = true;
            for (const int32_t a : n.alts) {
                n.first |= s.nodes[size_t(a)].first;
                if (!s.nodes[size_t(a)].nullable) {
                    n.nullable = false;
                    break;
                }
            }
            break;
    }
}
}  // namespace

void settle(JsonSchema& s) {
    // A node changes only when a part's does, and only grows (more bytes, empty or not): each
    // node is settled again when a part of it changed, until none does.
    std::vector<std::vector<int32_t>> users(s.nodes.size());
    for (size_t i = 0; i < s.nodes.size(); ++i) {
        s.nodes[i].first.reset();
        s.nodes[i].nullable = false;
        for (const int32_t a : s.nodes[i].alts) users[size_t(a)].push_back(int32_t(i));
    }
    std::vector<int32_t> work(s.nodes.size());
    std::vector<uint8_t> queued(s.nodes.size(), 1);
    for (size_t i = 0; i < work.size(); ++i) work[i] = int32_t(work.size() - 1 - i);
    while (!work.empty()) {
        const int32_t id = work.back();
        work.pop_back();
        queued[size_t(id)] = 0;
        Node& n = s.nodes[size_t(id)];
        const std::bitset<256> first = n.first;
        const bool nullable = n.nullable;
        settle_one(s, n);
        if (n.first == first && n.nullable == nullable) continue;
        for (const int32_t u : users[size_t(id)])
            if (!queued[size_t(u)]) {
                queued[size_t(u)] = 1;
                work.push_back(u);
            }
    }
}

JsonSchema json_object_schema() {
    return compile_json_schema(R"({"type": "object"})", "JSON mode");
}

JsonSchema regex_schema(const std::string& pattern, const std::string& what) {
    JsonSchema s;
    s.nodes.push_back(of(Kind::String));  // s.key (no objects here)
    s.patterns.push_back(compile_pattern(pattern, what, true));
    const PatternDfa& d = s.patterns[0];
    if (d.accept[size_t(d.start)] && d.edges[size_t(d.start)].empty()) fail(what, ": the pattern matches only the empty text");
    Node t = of(Kind::Text);
    t.pattern = 0;
    s.nodes.push_back(std::move(t));
    s.root = 1;
    settle(s);
    return s;
}

JsonSchema choice_schema(std::vector<std::string> choices, const std::string& what) {
    if (choices.empty()) fail(what, ": no choices");
    std::sort(choices.begin(), choices.end());
    choices.erase(std::unique(choices.begin(), choices.end()), choices.end());
    for (size_t i = 0; i < choices.size(); ++i) {
        if (choices[i].empty()) fail(what, ": a choice is empty");
        // Sorted, a choice that begins others comes right before one of them.
        if (i + 1 < choices.size() && choices[i + 1].compare(0, choices[i].size(), choices[i]) == 0)
            fail(what, ": \"", choices[i], "\" begins \"", choices[i + 1], "\" (the text could not tell where it ends)");
    }
    JsonSchema s;
    s.nodes.push_back(of(Kind::String));  // s.key (no objects here)
    Node c = of(Kind::Const);
    c.texts = std::move(choices);
    s.nodes.push_back(std::move(c));
    s.root = 1;
    settle(s);
    return s;
}

int64_t json_text_depth(const std::string& text) {
    int64_t depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;  // the escaped byte, whatever it is
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            deepest = std::max(deepest, ++depth);
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

JsonSchema compile_json_schema(const std::string& text, const std::string& what) {
    if (json_text_depth(text) > kMaxJsonDepth)
        fail(what, ": the JSON schema nests deeper than ", kMaxJsonDepth, " levels");
    json doc;
    try {
        doc = json::parse(text);
    } catch (const json::exception& e) {
        fail(what, ": the JSON schema is not JSON: ", e.what());
    }
    Compiler c(doc, what);
    return c.run();
}

}  // namespace shardlm
