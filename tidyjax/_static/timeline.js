// The tidyjax timeline page's chart, inlined into each page by tidyjax/_timeline_html.py.
// The page holds a title, a summary line, per device a static image (one area, the peak, the
// marks: what sanitizers keep) and the table of what was alive at the peak. This script finds
// its page (document.currentScript), inflates the data embedded in it (the fine columns per
// device, the sites, the scopes, the marks) and draws the chart in place of each image, at the
// page's own pixel size: the areas stacked by site (and above them, in a column whose moment
// is a tidyjax.jit call's, that call's XLA temporaries: a series per function), the axes (step
// numbers where the steps are scopes, else the time), the scopes as bands in lanes (a first
// step that took its compile named so), the peak (the device peak where temporaries make it),
// the marks and the legend; zoom (wheel, + and -, a click on a band), pan (drag, arrow keys),
// a hover tooltip that a click keeps, legend entries that isolate their site, and a device
// selector.
(function(){
var me=document.currentScript,root=me&&me.closest?me.closest(".tjtl"):null;
if(!root){  // run by a host that evaluates scripts elsewhere: the last page not yet drawn
  var all=document.querySelectorAll(".tjtl:not([data-ready]):not([data-busy])");
  root=all[all.length-1]}
if(!root||root.dataset.ready||root.dataset.busy)return;
var holder=root.querySelector("script.tj-data");
if(!holder||typeof DecompressionStream!=="function"||typeof atob!=="function")return;
root.dataset.busy="1";
var packed=JSON.parse(holder.textContent).deflated,bin=atob(packed);
var raw=new Uint8Array(bin.length);
for(var k=0;k<bin.length;k++)raw[k]=bin.charCodeAt(k);
new Response(new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate")))
  .text().then(function(text){start(JSON.parse(text))})
  .catch(function(e){delete root.dataset.busy;
    if(window.console)console.warn("tidyjax timeline: the static chart stays ("+e+")")});

var SVGNS="http://www.w3.org/2000/svg",MINW=14,CH=7.2,LANE=20,MAXLANES=6;
var COMPILED="first call (compile)";
var PALETTE=["#4e79a7","#f28e2b","#e15759","#76b7b2","#59a14f",
  "#edc948","#b07aa1","#ff9da7","#9c755f","#8cd17d"];
function fmt(n){  // as tidyjax's Python says it: ties to even ("31.2 KiB" for 31.25)
  var u=["B","KiB","MiB","GiB","TiB"],i=0;
  while(Math.abs(n)>=1024&&i<4){n/=1024;i++}
  var t=Math.round(n*10);if(Math.abs(n*10%1)===0.5&&t%2)t-=1;
  return i?(t/10).toFixed(1)+" "+u[i]:Math.round(n)+" B"}
function dt(s){
  return s<1?"+"+(s*1e3).toFixed(1)+" ms":s<120?"+"+s.toFixed(2)+" s":"+"+(s/60).toFixed(1)+" min"}
function dur(ms){return dt(ms/1e3).slice(1)}
function el(name,attrs,parent){
  var e=document.createElementNS(SVGNS,name);
  for(var a in attrs)e.setAttribute(a,attrs[a]);
  if(parent)parent.appendChild(e);return e}
function html(tag,cls,text,parent){
  var e=document.createElement(tag);if(cls)e.className=cls;
  if(text!=null)e.textContent=text;if(parent)parent.appendChild(e);return e}
function nice(v){  // a round byte step for about 4 ticks up to v
  if(v<=0)return 1;
  var unit=1,us=[1073741824,1048576,1024,1];
  for(var i=0;i<us.length;i++)if(v>=us[i]){unit=us[i];break}
  var raw=v/unit/4,mag=Math.pow(10,Math.floor(Math.log10(raw))),ms=[1,2,2.5,5,10];
  for(i=0;i<ms.length;i++)if(ms[i]*mag>=raw)return ms[i]*mag*unit;
  return 10*mag*unit}
function stride(k,most){
  for(var mag=1;;mag*=10)for(var m of[1,2,5])if(k<=most*m*mag)return m*mag}

// The scopes: each band {a, b (fine positions), name, path, ms, k (how many scopes)}; the steps
// (the path entered most often, at least 3 times, of the fewest levels: their positions, the
// first one's number per fine column); the compile (a first step over 5 times the others'
// median, and over 50 ms); lanes (nested or concurrent scopes below, at most MAXLANES).
function scopes(B,S){
  var all=[],count={},i;
  for(i=0;i<B.length;i+=6){
    var x={a:B[i],b:B[i+1],name:S[B[i+2]],path:S[B[i+3]],ms:B[i+4],k:B[i+5]};
    all.push(x);count[x.path]=(count[x.path]||0)+x.k}
  var out={path:null,steps:[],nums:[],compiled:false,hidden:0},depth=0;
  Object.keys(count).forEach(function(p){
    var d=p.split("/").length,q=out.path;
    if(count[p]>=3&&(q===null||d<depth||d===depth&&(count[p]>count[q]||
        count[p]===count[q]&&p<q))){out.path=p;depth=d}});
  var st=all.filter(function(x){return x.path===out.path}),n=1,last=-1;
  st.forEach(function(x){
    if(Math.floor(x.a)!==last){last=Math.floor(x.a);out.steps.push(x.a);out.nums.push(n)}
    n+=x.k});
  if(n-1>=3&&st[0].k===1){  // a path's first scope is a band of its own
    var rest=st.slice(1).map(function(x){return [x.ms/x.k,x.k]})
      .sort(function(p,q){return p[0]-q[0]}),half=Math.floor((n-2)/2),c=0;
    for(i=0;i<rest.length;i++){c+=rest[i][1];if(c>half){out.median=rest[i][0];break}}
    out.compiled=st[0].ms>Math.max(5*out.median,50);
    if(out.compiled){out.first=st[0].ms;st[0].name=COMPILED}}
  var seen={},ends=[];
  all.forEach(function(x){seen[x.name]=(seen[x.name]||0)+x.k});
  out.bands=all.filter(function(x){
    var l=0;
    x.lone=seen[x.name]<=2||x.name===COMPILED;  // rare: never merged with neighbours
    while(l<ends.length&&ends[l]>x.a+1e-9)l++;
    if(l===ends.length){if(l>=MAXLANES){out.hidden+=x.k;return false}ends.push(0)}
    ends[l]=x.b;x.lane=l;return true});
  out.lanes=ends.length+(out.hidden?1:0);
  return out}

function start(data){
  var F=data.fine,K=data.sites.length,S=data.strings;
  var times=new Float64Array(F),acc=0;
  for(var f=0;f<F;f++){acc+=data.times[f];times[f]=acc/1e6}
  var devs=data.devices.map(function(d){
    var v=new Float64Array(F*K),tot=new Float64Array(F),prev=new Float64Array(K);
    for(var f=0;f<F;f++){var t=0;
      for(var s=0;s<K;s++){prev[s]+=d.cols[f*K+s];v[f*K+s]=prev[s];t+=prev[s]}
      tot[f]=t}
    return {name:d.name,label:d.label,peak:d.peak,peakCol:d.peakCol,v:v,tot:tot,
      peakText:d.peakText||"peak "+fmt(d.peak)}});
  var sc=scopes(data.bands,S),steps=sc.steps,nums=sc.nums,bands=sc.bands,i;
  var M=data.marks,marks=[];  // annotations: fine position, label, bytes
  for(i=0;i<M.length;i+=3)marks.push({pos:M[i],label:S[M[i+1]],bytes:M[i+2]});
  function stepIndex(pos){  // how many steps start at or before pos
    var lo=0,hi=steps.length;
    while(lo<hi){var m=(lo+hi)>>1;if(steps[m]<=pos)lo=m+1;else hi=m}
    return lo}
  function stepAt(pos){var i=stepIndex(pos);return i?nums[i-1]:0}
  function colour(s){var site=data.sites[s];
    return site.other?"var(--tj-other)":site.temps?"var(--tj-temp)":PALETTE[s%PALETTE.length]}
  var state={a:0,b:F,dev:data.selected,iso:-1,pinned:false};

  // -- the frame: what the axis counts, tools, device buttons, a live SVG per image, legend --
  var sub=root.querySelector(".tj-sub");
  if(sub&&!data.moment){
    var note=sc.path===null?"x: events in order, ticks give the time since the start":
      "x: events in order, ticks at steps (scope "+sc.path+")";
    if(sc.compiled)note+="; step 1 took "+dur(sc.first)+", the first call (compile), the others "+
      dur(sc.median)+" (median)";
    html("span","tj-axis-note"," "+note+".",sub)}
  var first=root.querySelector(".tj-chart"),tools=html("div","tj-tools");
  function button(text,title,fn){
    var b=html("button",null,text,tools);b.type="button";b.title=title;
    b.addEventListener("click",fn);return b}
  var range=html("span","tj-range");
  if(!data.moment){
    button("−","zoom out (or -)",function(){zoom(2,0.5)});
    button("+","zoom in (or +)",function(){zoom(0.5,0.5)});
    button("reset","show the whole run (or 0)",function(){setView(0,F)}).className="tj-reset";
    tools.appendChild(range);
    html("span","tj-hint","wheel: zoom · drag: pan · click a band: its scope · click: keep details",
      tools)}
  root.insertBefore(tools,first);
  var buttons=[];
  if(devs.length>1){
    var group=html("div","tj-devices");group.setAttribute("role","group");
    group.setAttribute("aria-label","device");
    devs.forEach(function(d,j){
      var b=html("button",null,d.label,group);b.type="button";b.dataset.device=String(j);
      buttons.push(b);b.addEventListener("click",function(){state.dev=j;showDevice()})});
    root.insertBefore(group,first)}
  var tip=html("div","tj-tip",null,root);tip.hidden=true;
  var sections=root.querySelectorAll(".tj-chart");
  var charts=[].slice.call(sections).map(function(sec){
    var img=sec.querySelector("img.tj-static");
    var svg=el("svg",{"class":"tj-svg tj-live",role:"img",tabindex:"0",
      "aria-label":img?img.getAttribute("alt"):"timeline"});
    if(img){img.style.display="none";img.after(svg)}else sec.appendChild(svg);
    return {sec:sec,svg:svg,j:+sec.dataset.device}});
  var list=html("ul","tj-legend");
  sections[sections.length-1].after(list);
  var legend=data.sites.map(function(site,s){
    var li=html("li",null,null,list),sw=html("span","tj-sw",null,li);
    sw.setAttribute("aria-hidden","true");sw.style.backgroundColor=colour(s);
    li.appendChild(document.createTextNode(" "+site.label));
    li.dataset.site=String(s);li.setAttribute("role","button");li.tabIndex=0;
    li.setAttribute("aria-pressed","false");
    li.title="click: show "+(site.temps?"these temporaries":"this site")+
      " alone (click again: all)";
    li.addEventListener("click",function(){state.iso=state.iso===s?-1:s;isolate()});
    li.addEventListener("keydown",function(e){
      if(e.key==="Enter"||e.key===" "){e.preventDefault();li.click()}});
    li.addEventListener("mouseenter",function(){hot(s)});
    li.addEventListener("mouseleave",function(){hot(-1)});
    return li});

  function showDevice(){
    charts.forEach(function(c){c.sec.hidden=c.j!==state.dev});
    root.querySelectorAll(".tj-peak-table[data-device]").forEach(function(t){
      t.hidden=devs.length>1&&+t.dataset.device!==state.dev});
    buttons.forEach(function(b){b.setAttribute("aria-pressed",String(+b.dataset.device===state.dev))});
    unpin();render()}
  function areas(){return charts.reduce(function(out,c){
    return out.concat([].slice.call(c.svg.querySelectorAll(".tj-area")))},[])}
  function isolate(){
    legend.forEach(function(li){li.setAttribute("aria-pressed",String(+li.dataset.site===state.iso))});
    root.classList.toggle("tj-isolated",state.iso>=0);
    areas().forEach(function(a){a.classList.toggle("tj-dim",state.iso>=0&&+a.dataset.site!==state.iso)})}
  function hot(s){areas().forEach(function(a){a.classList.toggle("tj-hot",+a.dataset.site===s)})}

  // -- drawing ------------------------------------------------------------------------------
  var geo=null;  // the drawn chart's layout, for hit tests
  function setView(a,b){
    var span=Math.max(Math.min(b-a,F),Math.min(F,1));
    a=Math.max(0,Math.min(a,F-span));
    state.a=a;state.b=a+span;unpin();render()}
  function zoom(factor,at){  // at: where in the plot, 0..1
    var span=state.b-state.a,pos=state.a+at*span,ns=Math.max(1,Math.min(F,span*factor));
    setView(pos-at*ns,pos-at*ns+ns)}
  // The display columns, as fine boundaries: evenly cut, the peak's fine column one of its own
  // at least MINW wide (so that a short phase that makes the peak shows at first sight); each
  // shows its fine column of the largest total (pick).
  function layout(dev,a,b,X0,PW){
    var span=b-a,n0=Math.max(1,Math.min(span,Math.floor(PW))),bounds=[],d,f;
    for(d=0;d<=n0;d++)bounds.push(a+Math.floor(d*span/n0));
    var pc=dev.peakCol,dp=-1;
    if(!data.moment&&pc>=a&&pc<b){
      bounds.push(pc,pc+1);bounds.sort(function(p,q){return p-q});
      bounds=bounds.filter(function(x,i){return !i||x!==bounds[i-1]});
      dp=bounds.indexOf(pc)}
    var D=bounds.length-1,pick=new Int32Array(D),w=new Float64Array(D);
    for(d=0;d<D;d++){
      var lo=bounds[d],hi=bounds[d+1],best=lo;
      for(f=lo+1;f<hi;f++)if(dev.tot[f]>dev.tot[best])best=f;
      pick[d]=best;w[d]=(hi-lo)*PW/span}
    if(dp>=0&&w[dp]<MINW){
      for(d=0;d<D;d++)w[d]=(bounds[d+1]-bounds[d])*(PW-MINW)/(span-1);
      w[dp]=MINW}
    var xs=new Float64Array(D+1);xs[0]=X0;
    for(d=0;d<D;d++)xs[d+1]=xs[d]+w[d];
    function fx(pos){  // a fine position to x
      if(pos<=a)return X0;if(pos>=b)return X0+PW;
      var lo=0,hi=D;
      while(hi-lo>1){var m=(lo+hi)>>1;if(bounds[m]<=pos)lo=m;else hi=m}
      return xs[lo]+(pos-bounds[lo])/(bounds[lo+1]-bounds[lo])*w[lo]}
    var vmax=0;
    for(d=0;d<D;d++)vmax=Math.max(vmax,dev.tot[pick[d]]);
    return {D:D,pick:pick,xs:xs,fx:fx,dp:dp,vmax:vmax||1}}
  function axes(svg,g,a,b,X0,PW,Y0,PH){
    var bottom=Y0+PH,step=nice(g.vmax),ticks=[],i,f,span=b-a;
    for(var v=0;v<=g.vmax*1.0001;v+=step){
      var y=bottom-v/g.vmax*PH;
      el("line",{"class":"tj-grid",x1:X0,x2:X0+PW,y1:y,y2:y},svg);
      el("text",{"class":"tj-tick",x:X0-6,y:y+4,"text-anchor":"end"},svg).textContent=fmt(v)}
    if(data.moment)ticks.push([X0+PW/2,"one moment (a snapshot)"]);
    else{  // steps, or the time
      var s0=stepIndex(a),s1=stepIndex(b),inside=[];
      for(i=Math.max(0,s0-1);i<s1;i++)if(steps[i]>=a&&steps[i]<b)inside.push(i);
      if(inside.length>=2){
        var one=nums[inside[0]],count=nums[inside[inside.length-1]]-one+1;
        var st=stride(count,Math.max(2,Math.floor(PW/90))),prev=one-1;
        inside.forEach(function(i){var n=nums[i];
          if(n===1||Math.floor(n/st)>Math.floor(prev/st))ticks.push([g.fx(steps[i]),"step "+n]);
          prev=n})}
      else for(i=0;i<6;i++){  // the time, the step named where steps are scopes
        f=Math.min(b-1,a+Math.round(i*(span-1)/5));
        var n=steps.length?stepAt(f+0.5):0;
        ticks.push([g.fx(f+0.5),dt(times[f])+(n&&!i?" (step "+n+")":"")])}}
    var lastx=-1e9;
    ticks.forEach(function(t){
      if(t[0]-lastx<70)return;lastx=t[0];
      var anchor=t[0]<X0+30?"start":t[0]>X0+PW-30?"end":"middle";
      el("text",{"class":"tj-tick",x:t[0],y:bottom+17,"text-anchor":anchor},svg).textContent=t[1]});
    el("line",{"class":"tj-axis",x1:X0,x2:X0+PW,y1:bottom,y2:bottom},svg);
    el("text",{"class":"tj-ytitle",x:10,y:Y0+PH/2,"text-anchor":"middle",
      transform:"rotate(-90 10 "+(Y0+PH/2)+")"},svg).textContent="live bytes"}
  function stack(svg,dev,g,X0,PW,bottom,PH){  // the areas, bottom up
    var parent=el("g",{"class":"tj-areas"},svg),below=new Float64Array(g.D),scale=PH/g.vmax,d;
    for(var s=0;s<K;s++){
      var top=[],low=[];
      for(d=0;d<g.D;d++){
        var lowv=below[d],val=dev.v[g.pick[d]*K+s];below[d]=lowv+val;
        top.push((bottom-below[d]*scale).toFixed(1));low.push((bottom-lowv*scale).toFixed(1))}
      var p=["M"+X0+" "+top[0]];
      for(d=1;d<g.D;d++)if(top[d]!==top[d-1])p.push("H"+g.xs[d].toFixed(1)+"V"+top[d]);
      p.push("H"+(X0+PW)+"V"+low[g.D-1]);
      for(d=g.D-2;d>=0;d--)if(low[d]!==low[d+1])p.push("H"+g.xs[d+1].toFixed(1)+"V"+low[d]);
      p.push("H"+X0+"Z");
      var other=data.sites[s].other,temps=data.sites[s].temps,attrs={"class":"tj-area "+
        (other?"tj-other":temps?"tj-temp":"tj-s"+s),"data-site":s,
        "data-label":data.sites[s].label,d:p.join("")};
      if(!other&&!temps)attrs.fill=colour(s);
      el("path",attrs,parent)}}
  function lines(svg,dev,g,a,b,X0,PW,Y0,bottom){
    if(g.dp>=0){  // the peak, its label above the plot, clear of its line
      var px=(g.xs[g.dp]+g.xs[g.dp+1])/2,end=px>X0+PW*0.7,pg=el("g",{"class":"tj-peak"},svg);
      el("line",{x1:px,x2:px,y1:Y0,y2:bottom},pg);
      el("text",{x:end?px-6:px+6,y:Y0-9,"text-anchor":end?"end":"start"},pg).textContent=
        dev.peakText}
    // the marks: a dashed line each, labelled at the top (three rows, so neighbours clear)
    var mg=el("g",{"class":"tj-marks"},svg);
    marks.forEach(function(m,i){
      if(m.pos<a||m.pos>b)return;
      var mx=g.fx(m.pos),right=mx>X0+PW*0.6,full=m.label+(m.bytes==null?"":" ("+fmt(m.bytes)+")");
      var gm=el("g",{"class":"tj-mark","data-label":m.label},mg);
      el("line",{x1:mx,x2:mx,y1:Y0,y2:bottom},gm);
      el("text",{x:right?mx-4:mx+4,y:Y0+14+16*(i%3),"text-anchor":right?"end":"start"},gm)
        .textContent=full.length>40?full.slice(0,39)+"\u2026":full;
      el("title",{},gm).textContent=full})}
  function scopeBands(svg,g,a,b,X0,bottom){  // narrow neighbours in a lane merged
    var bg=el("g",{"class":"tj-bands"},svg),groups=[],lastIn={};
    bands.forEach(function(x){
      if(x.b<=a||x.a>=b)return;
      var x0=g.fx(Math.max(x.a,a)),x1=Math.max(g.fx(Math.min(x.b,b)),x0+1);
      var narrow=x.name.length*CH+6>x1-x0&&!x.lone,last=lastIn[x.lane];
      if(last&&narrow&&last.narrow&&x0-last.x1<8){
        last.m.push(x);last.x1=Math.max(last.x1,x1);return}
      groups.push(lastIn[x.lane]={lane:x.lane,x0:x0,x1:x1,m:[x],narrow:narrow})});
    groups.forEach(function(gr){
      var y=bottom+26+gr.lane*LANE,ms=0,counts={},last=gr.m.length-1,n=0;
      gr.m.forEach(function(x){ms+=x.ms;n+=x.k;counts[x.name]=(counts[x.name]||0)+x.k});
      var names=Object.keys(counts).sort(function(p,q){return counts[q]-counts[p]});
      var label=n===1?gr.m[0].name:names.slice(0,2).map(function(k){
        return counts[k]>1?k+" ×"+counts[k]:k}).join(", ")+(names.length>2?", …":"");
      var bandg=el("g",{"class":"tj-band","data-name":label,"data-a":gr.m[0].a,
        "data-b":gr.m[last].b},bg);
      var wide=(gr.x1-gr.x0)/gr.m.length>=3&&gr.m.length>1;
      (wide?gr.m:[null]).forEach(function(x){
        var x0=x?g.fx(Math.max(x.a,a)):gr.x0,x1=x?Math.max(g.fx(Math.min(x.b,b)),x0+1):gr.x1;
        el("rect",{x:x0,y:y,width:x1-x0,height:LANE-3,rx:2},bandg)});
      var text=label,room=gr.x1-gr.x0;
      if(text.length*CH+6>room){var keep=Math.floor((room-6)/CH)-1;text=keep>=3?text.slice(0,keep)+"…":""}
      if(text)el("text",{x:gr.x0+3,y:y+13},bandg).textContent=text;
      el("title",{},bandg).textContent=(n===1?"scope "+gr.m[0].path+": "+dur(ms):
        n+" scopes: "+dur(ms)+" in all")+" (click: zoom to it)";
      bandg.addEventListener("click",function(){
        var lo=gr.m[0].a,hi=gr.m[last].b;setView(lo,Math.max(hi,lo+1))})});
    if(sc.hidden)el("text",{"class":"tj-tick",x:X0,y:bottom+26+(sc.lanes-1)*LANE+13},bg)
      .textContent=sc.hidden+" more overlapping scopes not drawn"}
  function render(){
    var c=charts.filter(function(c){return c.j===state.dev})[0];
    if(!c)return;
    var svg=c.svg,dev=devs[c.j];
    var W=Math.max(300,Math.round(c.sec.clientWidth||svg.clientWidth||900));
    var X0=76,PW=W-X0-14,Y0=28,PH=Math.round(Math.max(170,Math.min(280,W*0.3)));
    var a=Math.floor(state.a),b=Math.max(a+1,Math.ceil(state.b)),bottom=Y0+PH;
    var g=layout(dev,a,b,X0,PW),H=bottom+26+sc.lanes*LANE+8;
    svg.setAttribute("viewBox","0 0 "+W+" "+H);
    svg.setAttribute("width",W);svg.setAttribute("height",H);
    svg.textContent="";
    el("rect",{"class":"tj-hit",x:X0,y:Y0,width:PW,height:PH},svg);
    axes(svg,g,a,b,X0,PW,Y0,PH);
    stack(svg,dev,g,X0,PW,bottom,PH);
    lines(svg,dev,g,a,b,X0,PW,Y0,bottom);
    scopeBands(svg,g,a,b,X0,bottom);
    geo={svg:svg,dev:dev,X0:X0,PW:PW,Y0:Y0,PH:PH,xs:g.xs,pick:g.pick,D:g.D,vmax:g.vmax};
    range.textContent=(a===0&&b===F)?"the whole run":
      "events "+Math.floor(a*data.events/F).toLocaleString()+"–"+
      Math.ceil(b*data.events/F).toLocaleString()+" of "+data.events.toLocaleString();
    isolate()}

  // -- the tooltip --------------------------------------------------------------------------
  function unpin(){state.pinned=false;tip.hidden=true;tip.classList.remove("tj-pinned");hot(-1)}
  function hit(e){  // the column and site under the pointer, or null
    if(!geo)return null;
    var r=geo.svg.getBoundingClientRect(),x=e.clientX-r.left,y=e.clientY-r.top;
    if(x<geo.X0||x>=geo.X0+geo.PW||y<geo.Y0||y>geo.Y0+geo.PH)return null;
    var lo=0,hi=geo.D;
    while(hi-lo>1){var m=(lo+hi)>>1;if(geo.xs[m]<=x)lo=m;else hi=m}
    var f=geo.pick[lo],v=(geo.Y0+geo.PH-y)/geo.PH*geo.vmax,cum=0,dev=geo.dev;
    for(var s=0;s<K;s++){var val=dev.v[f*K+s];
      if(val>0&&v>=cum&&v<cum+val&&(state.iso<0||state.iso===s))return {f:f,s:s};cum+=val}
    return null}
  function line(text,cls){html(cls==="b"?"b":"div",cls==="b"?null:cls,text,tip)}
  function showTip(e,h){
    var site=data.sites[h.s],dev=geo.dev,val=dev.v[h.f*K+h.s];
    tip.textContent="";line(site.label,"b");
    var at=dt(times[h.f]),n=steps.length?stepAt(h.f+0.5):0,when=", at "+at+
      (n?" (step "+n+")":"");
    if(site.temps){  // no array: what XLA held while a call ran, over the arrays alive then
      line(fmt(val)+" while the call ran; "+fmt(dev.tot[h.f])+" with the arrays on "+
        dev.name+when);
      line("calls over the run: "+site.allocs.toLocaleString()+
        (site.shapes?" ("+site.shapes+")":""));
      line("scopes of those calls: "+site.scopes);
      line("XLA's temporaries (memory_analysis): no array holds them","tj-tip-h")}
    else{
      line(fmt(val)+" live now, of "+fmt(dev.tot[h.f])+" live on "+dev.name+when);
      line("allocations over the run: "+site.allocs.toLocaleString()+" ("+site.shapes+")");
      line("dtype: "+site.dtypes);
      line("scopes of those allocations: "+site.scopes)}
    if(site.stack&&site.stack.length){line("stack (innermost first):","tj-tip-h");
      site.stack.forEach(function(fr){line(fr,"tj-frame")})}
    line(state.pinned?"kept: click elsewhere to let go":"click to keep these details","tj-tip-h");
    var r=root.getBoundingClientRect(),x=e.clientX-r.left+14;tip.hidden=false;
    if(x+tip.offsetWidth>r.width)x=Math.max(0,e.clientX-r.left-tip.offsetWidth-14);
    tip.style.left=x+"px";tip.style.top=(e.clientY-r.top+14)+"px";hot(h.s)}
  var drag=null;
  charts.forEach(function(c){
    var svg=c.svg;
    svg.addEventListener("mousemove",function(e){
      if(drag){
        var dx=e.clientX-drag.x;if(Math.abs(dx)>3)drag.moved=true;
        if(drag.moved){var span=drag.b-drag.a,sh=-dx/geo.PW*span;
          state.a=Math.max(0,Math.min(F-span,drag.a+sh));state.b=state.a+span;render()}
        return}
      if(state.pinned)return;
      var h=hit(e);if(!h){tip.hidden=true;hot(-1);return}
      showTip(e,h)});
    svg.addEventListener("mouseleave",function(){if(!state.pinned){tip.hidden=true;hot(-1)}});
    svg.addEventListener("mousedown",function(e){
      if(e.button!==0||!geo||e.target.closest(".tj-band"))return;
      drag={x:e.clientX,a:state.a,b:state.b,moved:false}});
    window.addEventListener("mouseup",function(e){
      if(!drag)return;var was=drag;drag=null;
      if(was.moved||e.target.closest&&e.target.closest(".tj-band"))return;
      var h=hit(e);
      if(!h||state.pinned){unpin();if(!h)return}
      state.pinned=true;tip.classList.add("tj-pinned");showTip(e,h)});
    svg.addEventListener("wheel",function(e){
      if(data.moment||!geo)return;
      var r=svg.getBoundingClientRect(),at=(e.clientX-r.left-geo.X0)/geo.PW;
      if(at<0||at>1)return;
      e.preventDefault();
      var unit=e.deltaMode===1?16:e.deltaMode===2?400:1,dx=e.deltaX*unit,dy=e.deltaY*unit;
      if(Math.abs(dx)>Math.abs(dy)){  // a sideways swipe pans
        var span=state.b-state.a;setView(state.a+dx/geo.PW*span,state.b+dx/geo.PW*span);return}
      zoom(Math.exp(Math.max(-1,Math.min(1,dy*0.002))),at)},
      {passive:false});
    svg.addEventListener("keydown",function(e){
      var span=state.b-state.a,k=e.key;
      if(k==="+"||k==="=")zoom(0.5,0.5);else if(k==="-")zoom(2,0.5);
      else if(k==="0")setView(0,F);
      else if(k==="ArrowLeft")setView(state.a-span/4,state.b-span/4);
      else if(k==="ArrowRight")setView(state.a+span/4,state.b+span/4);
      else if(k==="Escape")unpin();else return;
      e.preventDefault()})});
  // the tooltip's own clicks (selecting a stack to copy) keep it; a click elsewhere lets go
  tip.addEventListener("mouseup",function(e){e.stopPropagation()});
  document.addEventListener("mousedown",function(e){
    if(state.pinned&&!tip.contains(e.target)&&!charts.some(function(c){
      return c.svg.contains(e.target)}))unpin()});
  if(typeof ResizeObserver==="function"){
    var width=root.clientWidth;
    new ResizeObserver(function(){
      if(root.clientWidth!==width){width=root.clientWidth;requestAnimationFrame(render)}})
      .observe(root)}
  root.dataset.ready="1";delete root.dataset.busy;
  showDevice()}
})();
