#include "io/pickle_machine.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace shardtrain::io {
namespace {

// The pickle protocol's data opcodes that torch.save's and distributed checkpoints' programs use (protocol 2,
// torch.save's default; the protocol 4-5 ones that pickle_protocol= and plain pickle.dump add). pickletools
// documents each.
enum Op : uint8_t {
  kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2',
  kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = 0x8a, kNone = 'N', kNewTrue = 0x88, kNewFalse = 0x89,
  kBinFloat = 'G', kBinUnicode = 'X', kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kShortBinString = 'U',
  kBinString = 'T', kEmptyTuple = ')', kTuple = 't', kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87,
  kEmptyList = ']', kAppend = 'a', kAppends = 'e', kList = 'l', kEmptyDict = '}', kDict = 'd', kSetItem = 's',
  kSetItems = 'u', kGlobal = 'c', kStackGlobal = 0x93, kReduce = 'R', kBuild = 'b', kBinPersId = 'Q',
  kBinGet = 'h', kLongBinGet = 'j', kBinPut = 'q', kLongBinPut = 'r', kMemoize = 0x94, kProto = 0x80,
  kFrame = 0x95, kNewObj = 0x81,
};

}  // namespace

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kTuple: return "tuple";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kGlobal: return "global";
    case Value::Kind::kStorage: return "storage";
    case Value::Kind::kTensor: return "tensor";
    case Value::Kind::kObject: return "object";
  }
  return "?";
}

PickleMachine::PickleMachine(std::string path, std::string what, const char* program, size_t size)
    : path_(std::move(path)), what_(std::move(what)), p_(program), size_(size) {}

PickleMachine::~PickleMachine() = default;

ValuePtr PickleMachine::run() {
  while (true) {
    const size_t at = pos_;
    const uint8_t op = u8();
    switch (op) {
      case kProto: u8(); continue;
      case kFrame: take(8); continue;
      case kStop:
        if (stack_.size() != 1) fail("the program stops with " + std::to_string(stack_.size()) + " values");
        return stack_.back();
      case kMark: marks_.push_back(stack_.size()); continue;
      case kPop: pop(); continue;
      case kPopMark: since_mark(); continue;
      case kDup: {
        ValuePtr v = top();
        stack_.push_back(v);
        continue;
      }
      default: break;
    }
    if (push_scalar(op) || build_container(op) || make_object(op) || use_memo(op)) continue;
    char text[64];
    std::snprintf(text, sizeof(text), "opcode 0x%02x at byte %zu", op, at);
    fail(std::string(text) + ", which a file of data does not use");
  }
}

bool PickleMachine::push_scalar(uint8_t op) {
  switch (op) {
    case kNone: stack_.push_back(make(Value::Kind::kNone)); return true;
    case kNewTrue: case kNewFalse: {
      auto v = make(Value::Kind::kBool);
      v->i = op == kNewTrue;
      stack_.push_back(v);
      return true;
    }
    case kBinInt: push_int(static_cast<int32_t>(le(4))); return true;
    case kBinInt1: push_int(static_cast<int64_t>(le(1))); return true;
    case kBinInt2: push_int(static_cast<int64_t>(le(2))); return true;
    case kLong1: {
      const size_t n = u8();
      if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (8 at most expected)");
      uint64_t bits = n == 0 ? 0 : le(n);
      if (n > 0 && n < 8 && (bits >> (8 * n - 1)) != 0) bits |= ~uint64_t{0} << (8 * n);  // sign-extend
      push_int(static_cast<int64_t>(bits));
      return true;
    }
    case kBinFloat: {
      uint64_t bits = 0;
      for (const char c : take(8)) bits = (bits << 8) | static_cast<uint8_t>(c);  // big-endian
      auto v = make(Value::Kind::kFloat);
      std::memcpy(&v->f, &bits, sizeof(bits));
      stack_.push_back(v);
      return true;
    }
    case kBinUnicode: case kBinString: push_string(take(le(4))); return true;
    case kShortBinUnicode: case kShortBinString: push_string(take(u8())); return true;
    case kBinUnicode8: push_string(take(le(8))); return true;
    default: return false;
  }
}

bool PickleMachine::build_container(uint8_t op) {
  switch (op) {
    case kEmptyTuple: stack_.push_back(make(Value::Kind::kTuple)); return true;
    case kTuple: push_sequence(Value::Kind::kTuple, since_mark()); return true;
    case kTuple1: case kTuple2: case kTuple3: {
      const size_t n = op - kTuple1 + 1;
      if (stack_.size() < n) fail("a tuple of " + std::to_string(n) + " from a shorter stack");
      push_sequence(Value::Kind::kTuple, std::vector<ValuePtr>(stack_.end() - n, stack_.end()), n);
      return true;
    }
    case kEmptyList: stack_.push_back(make(Value::Kind::kList)); return true;
    case kList: push_sequence(Value::Kind::kList, since_mark()); return true;
    case kAppend: {
      ValuePtr item = pop();
      expect(top(), Value::Kind::kList, "APPEND")->items.push_back(item);
      return true;
    }
    case kAppends: {
      std::vector<ValuePtr> items = since_mark();
      auto& list = expect(top(), Value::Kind::kList, "APPENDS")->items;
      list.insert(list.end(), items.begin(), items.end());
      return true;
    }
    case kEmptyDict: stack_.push_back(make(Value::Kind::kDict)); return true;
    case kDict: {
      std::vector<ValuePtr> items = since_mark();
      stack_.push_back(make(Value::Kind::kDict));
      set_items(top(), items);
      return true;
    }
    case kSetItem: {
      ValuePtr value = pop(), key = pop();
      set_items(top(), {key, value});
      return true;
    }
    case kSetItems: {
      std::vector<ValuePtr> items = since_mark();  // before top(): the dict is below the mark
      set_items(top(), items);
      return true;
    }
    default: return false;
  }
}

bool PickleMachine::make_object(uint8_t op) {
  switch (op) {
    case kGlobal: {
      std::string module = line(), name = line();
      push_global(module + "." + name);
      return true;
    }
    case kStackGlobal: {
      ValuePtr name = pop(), module = pop();
      push_global(expect(module, Value::Kind::kString, "STACK_GLOBAL")->s + "." +
                  expect(name, Value::Kind::kString, "STACK_GLOBAL")->s);
      return true;
    }
    case kReduce: {
      ValuePtr args = pop(), callable = pop();
      stack_.push_back(call(expect(callable, Value::Kind::kGlobal, "REDUCE")->s,
                            expect(args, Value::Kind::kTuple, "REDUCE")->items));
      return true;
    }
    case kBuild: {
      ValuePtr state = pop();
      build(top(), state);
      return true;
    }
    case kNewObj: {
      ValuePtr args = pop(), cls = pop();
      stack_.push_back(new_object(expect(cls, Value::Kind::kGlobal, "NEWOBJ")->s,
                                  expect(args, Value::Kind::kTuple, "NEWOBJ")->items));
      return true;
    }
    case kBinPersId: stack_.push_back(persistent_load(pop())); return true;
    default: return false;
  }
}

bool PickleMachine::use_memo(uint8_t op) {
  switch (op) {
    case kBinGet: case kLongBinGet: {
      const uint64_t key = le(op == kBinGet ? 1 : 4);
      auto it = memo_.find(key);
      if (it == memo_.end()) fail("memo entry " + std::to_string(key) + " read before it was written");
      stack_.push_back(it->second);
      return true;
    }
    case kBinPut: memo_[le(1)] = top(); return true;
    case kLongBinPut: memo_[le(4)] = top(); return true;
    case kMemoize: memo_[memo_.size()] = top(); return true;
    default: return false;
  }
}

void PickleMachine::fail(const std::string& what) const {
  throw std::runtime_error(path_ + ": cannot read " + what_ + ": " + what);
}

ValuePtr PickleMachine::make(Value::Kind kind) {
  arena_.push_back(std::make_unique<Value>());
  arena_.back()->kind = kind;
  return arena_.back().get();
}

std::string PickleMachine::take(uint64_t n) {
  if (n > size_ - pos_) fail("the pickle program ends inside an instruction (truncated file?)");
  std::string out(p_ + pos_, p_ + pos_ + n);
  pos_ += n;
  return out;
}
uint64_t PickleMachine::le(size_t n) {  // an unsigned little-endian integer of n bytes
  const std::string bytes = take(n);
  uint64_t v = 0;
  for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<uint8_t>(bytes[k]);
  return v;
}
std::string PickleMachine::line() {
  const void* end = std::memchr(p_ + pos_, '\n', size_ - pos_);
  if (end == nullptr) fail("a GLOBAL without its newline");
  std::string out = take(static_cast<const char*>(end) - (p_ + pos_));
  pos_ += 1;
  return out;
}
ValuePtr PickleMachine::top() {
  if (stack_.empty()) fail("an instruction reads an empty stack");
  return stack_.back();
}
ValuePtr PickleMachine::pop() {
  ValuePtr v = top();
  stack_.pop_back();
  return v;
}
std::vector<ValuePtr> PickleMachine::since_mark() {
  if (marks_.empty() || marks_.back() > stack_.size()) fail("an instruction expects a MARK that is not there");
  std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
  stack_.resize(marks_.back());
  marks_.pop_back();
  return items;
}
ValuePtr PickleMachine::expect(const ValuePtr& v, Value::Kind kind, const char* op) const {
  if (v->kind != kind) {
    fail(std::string(op) + " expects a " + kind_name(kind) + ", found a " + kind_name(v->kind));
  }
  return v;
}
void PickleMachine::push_int(int64_t i) {
  auto v = make(Value::Kind::kInt);
  v->i = i;
  stack_.push_back(v);
}
void PickleMachine::push_string(std::string s) {
  auto v = make(Value::Kind::kString);
  v->s = std::move(s);
  stack_.push_back(v);
}
void PickleMachine::push_global(std::string name) {
  auto v = make(Value::Kind::kGlobal);
  v->s = std::move(name);
  stack_.push_back(v);
}
void PickleMachine::push_sequence(Value::Kind kind, std::vector<ValuePtr> items, size_t popped) {
  stack_.resize(stack_.size() - popped);
  auto v = make(kind);
  v->items = std::move(items);
  stack_.push_back(v);
}
void PickleMachine::set_items(const ValuePtr& dict, const std::vector<ValuePtr>& items) {
  expect(dict, Value::Kind::kDict, "SETITEM");
  if (items.size() % 2 != 0) fail("SETITEMS with a key and no value");
  for (size_t k = 0; k < items.size(); k += 2) {
    if (items[k]->kind == Value::Kind::kString) {
      auto [it, added] = dict->keys.emplace(items[k]->s, dict->items.size());
      if (!added) {  // a key set again: Python keeps its first place and the last value
        dict->items[it->second + 1] = items[k + 1];
        continue;
      }
    }
    dict->items.push_back(items[k]);
    dict->items.push_back(items[k + 1]);
  }
}

int64_t PickleMachine::int_arg(const std::vector<ValuePtr>& args, size_t k, const std::string& fn) const {
  if (args.size() <= k || args[k]->kind != Value::Kind::kInt) fail(fn + "'s argument " + std::to_string(k) +
                                                                   " is not an integer");
  return args[k]->i;
}
std::vector<int64_t> PickleMachine::ints_arg(const std::vector<ValuePtr>& args, size_t k,
                                             const std::string& fn) const {
  if (args.size() <= k || args[k]->kind != Value::Kind::kTuple) fail(fn + "'s argument " + std::to_string(k) +
                                                                     " is not a tuple");
  std::vector<int64_t> out;
  for (const auto& item : args[k]->items) {
    if (item->kind != Value::Kind::kInt) fail(fn + "'s argument " + std::to_string(k) + " holds a non-integer");
    out.push_back(item->i);
  }
  return out;
}

ValuePtr PickleMachine::call(const std::string& fn, const std::vector<ValuePtr>&) {
  fail("the file calls " + fn + ", which it has no need of");
}

ValuePtr PickleMachine::new_object(const std::string& cls, const std::vector<ValuePtr>&) {
  fail("the file makes an object of class " + cls + ", which it has no need of");
}

ValuePtr PickleMachine::persistent_load(const ValuePtr&) { fail("a persistent id, which the file has no need of"); }

void PickleMachine::build(const ValuePtr& target, const ValuePtr& state) {
  if (target->kind == Value::Kind::kObject) {
    target->state = state;
    return;
  }
  if (target->kind != Value::Kind::kDict) {
    fail(std::string("BUILD of a ") + kind_name(target->kind) + " (only a dict's or an object's state is expected)");
  }
}

}  // namespace shardtrain::io
