using System;
using System.Collections;
using System.Collections.Generic;
using System.Text;

namespace Virtufin.Worker.Json
{
    /// <summary>
    /// A JSON object: members in insertion order, names compared ordinally.
    /// Works with collection initializers: <c>new JsonObject { ["a"] = 1 }</c>
    /// or <c>new JsonObject { { "a", 1 } }</c>.
    /// </summary>
    public sealed class JsonObject : JsonNode, IEnumerable<KeyValuePair<string, JsonNode>>
    {
        readonly Dictionary<string, JsonNode> members = new Dictionary<string, JsonNode>(StringComparer.Ordinal);
        readonly List<string> order = new List<string>();

        /// <summary>An empty object.</summary>
        public JsonObject() { }

        /// <summary>The number of members.</summary>
        public int Count { get { return order.Count; } }

        /// <summary>The member named key (null when absent or JSON null); setting
        /// replaces it in place or appends it.</summary>
        public override JsonNode this[string key]
        {
            get
            {
                JsonNode value;
                members.TryGetValue(CheckKey(key), out value);
                return value;
            }
            set
            {
                if (!members.ContainsKey(CheckKey(key))) order.Add(key);
                members[key] = value;
            }
        }

        /// <summary>Adds a member; throws <see cref="ArgumentException"/> when the name exists.</summary>
        public void Add(string key, JsonNode value)
        {
            if (members.ContainsKey(CheckKey(key)))
                throw new ArgumentException("the JSON object already has a member named \"" + key + "\"", "key");
            members.Add(key, value);
            order.Add(key);
        }

        /// <summary>Whether a member named key exists (it may be JSON null).</summary>
        public bool ContainsKey(string key)
        {
            return members.ContainsKey(CheckKey(key));
        }

        /// <summary>The member named key, if it exists.</summary>
        public bool TryGetPropertyValue(string key, out JsonNode value)
        {
            return members.TryGetValue(CheckKey(key), out value);
        }

        /// <summary>Removes the member named key; false when there was none.</summary>
        public bool Remove(string key)
        {
            if (!members.Remove(CheckKey(key))) return false;
            order.Remove(key);
            return true;
        }

        /// <summary>Removes all members.</summary>
        public void Clear()
        {
            members.Clear();
            order.Clear();
        }

        /// <summary>The members in order.</summary>
        public IEnumerator<KeyValuePair<string, JsonNode>> GetEnumerator()
        {
            foreach (var key in order.ToArray())
                yield return new KeyValuePair<string, JsonNode>(key, members[key]);
        }

        IEnumerator IEnumerable.GetEnumerator() { return GetEnumerator(); }

        static string CheckKey(string key)
        {
            if (key == null) throw new ArgumentNullException("key");
            return key;
        }

        internal override void WriteTo(StringBuilder sb, int depth)
        {
            sb.Append('{');
            for (int i = 0; i < order.Count; i++)
            {
                if (i > 0) sb.Append(',');
                WriteString(sb, order[i]);
                sb.Append(':');
                Write(members[order[i]], sb, depth + 1);
            }
            sb.Append('}');
        }

        internal override JsonNode CloneAt(int depth)
        {
            var copy = new JsonObject();
            foreach (var key in order) copy.Add(key, Clone(members[key], depth + 1));
            return copy;
        }

        internal override bool EqualsAt(JsonNode other, int depth)
        {
            var o = other as JsonObject;
            if (o == null || o.Count != Count) return false;
            foreach (var key in order)
            {
                JsonNode theirs;
                if (!o.members.TryGetValue(key, out theirs) || !Equal(members[key], theirs, depth + 1)) return false;
            }
            return true;
        }
    }
}
